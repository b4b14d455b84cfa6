/*
 * babysit_spank.so: the `--babysit[=ckpt=DIR,max_requeues=N,hang_timeout=S]` option for
 * sbatch/salloc/srun.
 *
 *  - allocator/local context: validate the value (a bad value fails the submission with a
 *    clear message) and hand it to job_submit.lua through the job-control environment
 *    (spank_job_control_setenv), which records it as the job's AdminComment `babysit=<args>`;
 *  - remote context (slurmstepd, at task start): set BABYSIT_CKPT and, when the controller
 *    has written <ckpt>/.babysitter/resume.json, BABYSIT_RESUME_FROM=<path> for the tasks.
 *
 * 22.05 sbatch ignores a static spank_options table: the option is registered with
 * spank_option_register() in slurm_spank_init().
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <slurm/spank.h>

SPANK_PLUGIN(babysit, 1);

#define MAX_ARG 1024
static char babysit_value[MAX_ARG];
static int babysit_given = 0;

static int opt_cb(int val, const char *optarg, int remote);

static struct spank_option babysit_option = {
    "babysit",
    "[ckpt=DIR,max_requeues=N,hang_timeout=S]",
    "Let babysitter requeue this job from its last complete checkpoint when its node fails.",
    2, /* optional argument */
    0,
    opt_cb,
};

/* Same rules as babysitter.job.parse_babysit_args (a test checks they agree). */
static int validate(const char *arg, char *err, size_t errlen) {
    char buf[MAX_ARG];
    int seen_ckpt = 0, seen_mr = 0, seen_ht = 0;
    if (!arg || !*arg) return 0;
    if (strlen(arg) >= sizeof buf) { snprintf(err, errlen, "value too long"); return -1; }
    strcpy(buf, arg);
    char *save = NULL;
    for (char *part = strtok_r(buf, ",", &save); part; part = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*part)) part++;
        if (!*part) continue;
        char *eq = strchr(part, '=');
        if (!eq || !eq[1]) { snprintf(err, errlen, "'%s' is not key=value", part); return -1; }
        *eq = 0;
        const char *key = part, *v = eq + 1;
        int *seen = NULL;
        if (!strcmp(key, "ckpt")) seen = &seen_ckpt;
        else if (!strcmp(key, "max_requeues")) seen = &seen_mr;
        else if (!strcmp(key, "hang_timeout")) seen = &seen_ht;
        else {
            snprintf(err, errlen, "unknown key '%s' (known: ckpt, max_requeues, hang_timeout)", key);
            return -1;
        }
        if (*seen) { snprintf(err, errlen, "'%s' given twice", key); return -1; }
        *seen = 1;
        if (seen == &seen_ckpt) {
            if (v[0] != '/') { snprintf(err, errlen, "ckpt must be an absolute path"); return -1; }
            continue;
        }
        for (const char *c = v; *c; c++)
            if (!isdigit((unsigned char)*c)) {
                snprintf(err, errlen, "%s must be a non-negative integer", key);
                return -1;
            }
        long n = strtol(v, NULL, 10);
        if (strlen(v) > 8 || n > 10000000L) { snprintf(err, errlen, "%s is too large", key); return -1; }
        if (seen == &seen_ht && n == 0) { snprintf(err, errlen, "hang_timeout must be > 0"); return -1; }
    }
    return 0;
}

static int opt_cb(int val, const char *optarg, int remote) {
    (void)val;
    char err[256] = "";
    const char *arg = optarg ? optarg : "";
    if (validate(arg, err, sizeof err) != 0) {
        slurm_error("--babysit: %s", err);
        return -1;
    }
    snprintf(babysit_value, sizeof babysit_value, "%s", arg);
    babysit_given = 1;
    (void)remote;
    return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av) {
    (void)ac; (void)av;
    if (spank_option_register(sp, &babysit_option) != ESPANK_SUCCESS) {
        slurm_error("babysit: cannot register --babysit");
        return -1;
    }
    return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av) {
    (void)ac; (void)av;
    spank_context_t ctx = spank_context();
    if (!babysit_given || (ctx != S_CTX_ALLOCATOR && ctx != S_CTX_LOCAL)) return 0;
    /* job_submit.lua copies this into AdminComment ("babysit=<args>") */
    if (spank_job_control_setenv(sp, "BABYSIT", babysit_value, 1) != ESPANK_SUCCESS) {
        slurm_error("babysit: cannot pass --babysit to the controller");
        return -1;
    }
    return 0;
}

/* Find "key": "value" in a small JSON document (resume.json is written by babysitter). */
static int json_string(const char *doc, const char *key, char *out, size_t outlen) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(doc, pat);
    if (!p) return -1;
    p += strlen(pat);
    while (*p && (isspace((unsigned char)*p) || *p == ':')) p++;
    if (*p != '"') return -1;
    p++;
    size_t i = 0;
    while (*p && *p != '"' && i + 1 < outlen) {
        if (*p == '\\' && p[1]) p++;
        out[i++] = *p++;
    }
    if (*p != '"') return -1;
    out[i] = 0;
    return 0;
}

static void ckpt_of(const char *value, char *out, size_t outlen) {
    out[0] = 0;
    const char *p = strstr(value, "ckpt=");
    while (p && p != value && p[-1] != ',') p = strstr(p + 1, "ckpt=");
    if (!p) return;
    p += 5;
    size_t i = 0;
    while (*p && *p != ',' && i + 1 < outlen) out[i++] = *p++;
    out[i] = 0;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av) {
    (void)ac; (void)av;
    if (spank_context() != S_CTX_REMOTE) return 0;
    char value[MAX_ARG] = "";
    char *optarg = NULL;
    if (spank_option_getopt(sp, &babysit_option, &optarg) == ESPANK_SUCCESS) {
        snprintf(value, sizeof value, "%s", optarg ? optarg : "");
    } else if (babysit_given) {
        snprintf(value, sizeof value, "%s", babysit_value);
    } else if (spank_getenv(sp, "SPANK_BABYSIT", value, sizeof value) != ESPANK_SUCCESS) {
        return 0;  /* not a babysat job */
    }
    char ckpt[512];
    ckpt_of(value, ckpt, sizeof ckpt);
    if (!ckpt[0]) return 0;
    spank_setenv(sp, "BABYSIT_CKPT", ckpt, 1);
    char path[1024];
    snprintf(path, sizeof path, "%s/.babysitter/resume.json", ckpt);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char doc[8192];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[n] = 0;
    char resume[1024];
    struct stat st;
    if (json_string(doc, "path", resume, sizeof resume) == 0 && stat(resume, &st) == 0)
        spank_setenv(sp, "BABYSIT_RESUME_FROM", resume, 1);
    else
        slurm_info("babysit: %s names no existing checkpoint; starting fresh", path);
    return 0;
}
