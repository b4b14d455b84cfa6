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
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/*
 * The value's rules, shared with babysitter.job.parse_babysit_args (tests/test_spank.py feeds
 * both the same generated specs): comma-separated key=value parts (empty parts skipped),
 * keys ckpt (an absolute path of at most MAX_CKPT bytes), max_requeues and hang_timeout
 * (ASCII digits, at most 8, at most 10^7; hang_timeout > 0), each at most once; the whole
 * value at most MAX_ARG - 1 bytes and without any whitespace, ASCII or Unicode (what Python's
 * str.isspace() calls whitespace): AdminComment is split on whitespace by the controller, so a
 * value with a space in it could not mean the same thing on both sides. Compiled alone (with
 * BABYSIT_PARSE_ONLY) by the test.
 */
#define MAX_ARG 8192
#define MAX_CKPT 4095 /* PATH_MAX less its NUL */

struct babysit_spec { char ckpt[MAX_CKPT + 1]; };

/* The code point of the UTF-8 sequence at s (its length in *len); -1: not valid UTF-8. */
static long utf8_at(const unsigned char *s, int *len) {
    long cp;
    int n;
    if (s[0] < 0x80) { *len = 1; return s[0]; }
    if ((s[0] & 0xE0) == 0xC0) { n = 2; cp = s[0] & 0x1F; }
    else if ((s[0] & 0xF0) == 0xE0) { n = 3; cp = s[0] & 0x0F; }
    else if ((s[0] & 0xF8) == 0xF0) { n = 4; cp = s[0] & 0x07; }
    else { *len = 1; return -1; }
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) { *len = 1; return -1; }
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    *len = n;
    return cp;
}

/* Python's str.isspace(), for one code point. */
static int py_space(long cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 ||
           cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static int has_space(const char *arg) {
    const unsigned char *s = (const unsigned char *)arg;
    while (*s) {
        int len;
        long cp = utf8_at(s, &len);
        if (cp >= 0 && py_space(cp)) return 1;
        s += len;
    }
    return 0;
}

/* Validate `arg` (the value of --babysit) and, when out is not NULL, return its ckpt. */
static int parse(const char *arg, struct babysit_spec *out, char *err, size_t errlen) {
    static char buf[MAX_ARG];
    int seen_ckpt = 0, seen_mr = 0, seen_ht = 0;
    if (out) out->ckpt[0] = 0;
    if (!arg || !*arg) return 0;
    if (strlen(arg) >= sizeof buf) { snprintf(err, errlen, "value too long"); return -1; }
    if (has_space(arg)) { snprintf(err, errlen, "no whitespace allowed in the value"); return -1; }
    strcpy(buf, arg);
    char *save = NULL;
    for (char *part = strtok_r(buf, ",", &save); part; part = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(part, '=');
        if (!eq || !eq[1]) { snprintf(err, errlen, "'%.64s' is not key=value", part); return -1; }
        *eq = 0;
        const char *key = part, *v = eq + 1;
        int *seen = NULL;
        if (!strcmp(key, "ckpt")) seen = &seen_ckpt;
        else if (!strcmp(key, "max_requeues")) seen = &seen_mr;
        else if (!strcmp(key, "hang_timeout")) seen = &seen_ht;
        else {
            snprintf(err, errlen, "unknown key '%.64s' (known: ckpt, max_requeues, hang_timeout)", key);
            return -1;
        }
        if (*seen) { snprintf(err, errlen, "'%s' given twice", key); return -1; }
        *seen = 1;
        if (seen == &seen_ckpt) {
            if (v[0] != '/') { snprintf(err, errlen, "ckpt must be an absolute path"); return -1; }
            if (strlen(v) > MAX_CKPT) { snprintf(err, errlen, "ckpt is not a usable path"); return -1; }
            if (out) snprintf(out->ckpt, sizeof out->ckpt, "%s", v);
            continue;
        }
        for (const char *c = v; *c; c++)
            if (*c < '0' || *c > '9') {
                snprintf(err, errlen, "%s must be a non-negative integer", key);
                return -1;
            }
        long n = strtol(v, NULL, 10);
        if (strlen(v) > 8 || n > 10000000L) { snprintf(err, errlen, "%s is too large", key); return -1; }
        if (seen == &seen_ht && n == 0) { snprintf(err, errlen, "hang_timeout must be > 0"); return -1; }
    }
    return 0;
}

#ifndef BABYSIT_PARSE_ONLY
#include <slurm/spank.h>

SPANK_PLUGIN(babysit, 1);

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

static int opt_cb(int val, const char *optarg, int remote) {
    (void)val;
    char err[256] = "";
    const char *arg = optarg ? optarg : "";
    if (parse(arg, NULL, err, sizeof err) != 0) {
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

/*
 * resume.json is read with a small, strict JSON reader: the top-level object's "path" string,
 * decoded exactly as Python wrote it. json.dumps writes ASCII: non-ASCII characters are \uXXXX
 * (surrogate pairs above U+FFFF) and bytes of a path that is not UTF-8 are lone surrogates
 * \uDC80-\uDCFF (Python's surrogateescape), which map back to the byte 0x80-0xFF.
 */
struct jr { const char *p, *end; };

static void jr_ws(struct jr *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static int jr_hex4(struct jr *r, unsigned *out) {
    if (r->end - r->p < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = r->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    r->p += 4;
    *out = v;
    return 0;
}

static int put_byte(char *out, size_t outlen, size_t *n, unsigned char b) {
    if (*n + 1 >= outlen) return -1;
    out[(*n)++] = (char)b;
    return 0;
}

static int put_utf8(char *out, size_t outlen, size_t *n, unsigned cp) {
    if (cp < 0x80) return put_byte(out, outlen, n, (unsigned char)cp);
    if (cp < 0x800)
        return put_byte(out, outlen, n, (unsigned char)(0xC0 | (cp >> 6))) ||
               put_byte(out, outlen, n, (unsigned char)(0x80 | (cp & 0x3F)));
    if (cp < 0x10000)
        return put_byte(out, outlen, n, (unsigned char)(0xE0 | (cp >> 12))) ||
               put_byte(out, outlen, n, (unsigned char)(0x80 | ((cp >> 6) & 0x3F))) ||
               put_byte(out, outlen, n, (unsigned char)(0x80 | (cp & 0x3F)));
    return put_byte(out, outlen, n, (unsigned char)(0xF0 | (cp >> 18))) ||
           put_byte(out, outlen, n, (unsigned char)(0x80 | ((cp >> 12) & 0x3F))) ||
           put_byte(out, outlen, n, (unsigned char)(0x80 | ((cp >> 6) & 0x3F))) ||
           put_byte(out, outlen, n, (unsigned char)(0x80 | (cp & 0x3F)));
}

/* A JSON string at r->p (the opening quote), decoded into out (NUL-terminated; out may be NULL
 * to skip). -1 on malformed input, a NUL character, or no room. */
static int jr_string(struct jr *r, char *out, size_t outlen) {
    char scratch[8];
    size_t n = 0;
    if (!out) { out = scratch; outlen = sizeof scratch; }
    int skipping = out == scratch;
    if (r->p >= r->end || *r->p != '"') return -1;
    r->p++;
    while (r->p < r->end && *r->p != '"') {
        unsigned char c = (unsigned char)*r->p++;
        unsigned cp;
        if (c < 0x20) return -1;
        if (c != '\\') {
            if (!skipping && put_byte(out, outlen, &n, c)) return -1;
            continue;
        }
        if (r->p >= r->end) return -1;
        c = (unsigned char)*r->p++;
        switch (c) {
        case '"': case '\\': case '/': cp = c; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (jr_hex4(r, &cp)) return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF && r->end - r->p >= 6 && r->p[0] == '\\' &&
                r->p[1] == 'u') {
                struct jr save = *r;
                unsigned lo;
                r->p += 2;
                if (jr_hex4(r, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else {
                    *r = save;
                    return -1;
                }
            } else if (cp >= 0xDC80 && cp <= 0xDCFF) {
                /* surrogateescape: one raw byte of a name that is not UTF-8 */
                if (!skipping && put_byte(out, outlen, &n, (unsigned char)(cp - 0xDC00))) return -1;
                continue;
            } else if (cp >= 0xD800 && cp <= 0xDFFF) {
                return -1;
            }
            if (cp == 0) return -1;
            break;
        default:
            return -1;
        }
        if (!skipping && put_utf8(out, outlen, &n, cp)) return -1;
    }
    if (r->p >= r->end) return -1;
    r->p++;
    if (!skipping) out[n] = 0;
    return 0;
}

static int jr_skip(struct jr *r, int depth) {
    jr_ws(r);
    if (r->p >= r->end || depth > 32) return -1;
    if (*r->p == '"') return jr_string(r, NULL, 0);
    if (*r->p == '{' || *r->p == '[') {
        char close = *r->p == '{' ? '}' : ']';
        r->p++;
        jr_ws(r);
        if (r->p < r->end && *r->p == close) { r->p++; return 0; }
        for (;;) {
            if (close == '}') {
                jr_ws(r);
                if (jr_string(r, NULL, 0)) return -1;
                jr_ws(r);
                if (r->p >= r->end || *r->p++ != ':') return -1;
            }
            if (jr_skip(r, depth + 1)) return -1;
            jr_ws(r);
            if (r->p >= r->end) return -1;
            if (*r->p == ',') { r->p++; continue; }
            if (*r->p++ == close) return 0;
            return -1;
        }
    }
    while (r->p < r->end && (isalnum((unsigned char)*r->p) || *r->p == '-' || *r->p == '+' || *r->p == '.'))
        r->p++;
    return 0;
}

/* The top-level string member `key` of a JSON object. */
static int json_string(const char *doc, size_t len, const char *key, char *out, size_t outlen) {
    struct jr r = {doc, doc + len};
    char name[64];
    jr_ws(&r);
    if (r.p >= r.end || *r.p++ != '{') return -1;
    for (;;) {
        jr_ws(&r);
        if (jr_string(&r, name, sizeof name)) return -1;
        jr_ws(&r);
        if (r.p >= r.end || *r.p++ != ':') return -1;
        jr_ws(&r);
        if (!strcmp(name, key)) return r.p < r.end && *r.p == '"' ? jr_string(&r, out, outlen) : -1;
        if (jr_skip(&r, 0)) return -1;
        jr_ws(&r);
        if (r.p >= r.end || *r.p++ != ',') return -1;
    }
}

#define RESUME_CAP 65536

/* <ckpt>/.babysitter/resume.json into doc: `.babysitter` and the file are opened without
 * following links and without blocking (a FIFO is refused), only a regular file of at most
 * RESUME_CAP bytes is read. This runs as the job's user (user_init drops privileges). */
static ssize_t read_resume(const char *ckpt, char *doc, size_t cap) {
    int root = open(ckpt, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
    if (root < 0) return -1;
    int dir = openat(root, ".babysitter", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    close(root);
    if (dir < 0) return -1;
    int fd = openat(dir, "resume.json", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    close(dir);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (off_t)cap) {
        close(fd);
        return -2;
    }
    size_t n = 0;
    while (n < cap) {
        ssize_t k = read(fd, doc + n, cap - n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        n += (size_t)k;
    }
    close(fd);
    return (ssize_t)n;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av) {
    (void)ac; (void)av;
    if (spank_context() != S_CTX_REMOTE) return 0;
    static char value[MAX_ARG];
    value[0] = 0;
    char *optarg = NULL;
    if (spank_option_getopt(sp, &babysit_option, &optarg) == ESPANK_SUCCESS) {
        snprintf(value, sizeof value, "%s", optarg ? optarg : "");
    } else if (babysit_given) {
        snprintf(value, sizeof value, "%s", babysit_value);
    } else if (spank_getenv(sp, "SPANK_BABYSIT", value, sizeof value) != ESPANK_SUCCESS) {
        return 0;  /* not a babysat job */
    }
    /* the same parse as at submission: the ckpt the controller reads from AdminComment */
    static struct babysit_spec spec;
    char err[256];
    if (parse(value, &spec, err, sizeof err) != 0 || !spec.ckpt[0]) return 0;
    const char *ckpt = spec.ckpt;
    spank_setenv(sp, "BABYSIT_CKPT", ckpt, 1);
    static char doc[RESUME_CAP];
    ssize_t n = read_resume(ckpt, doc, sizeof doc);
    if (n == -1) return 0;  /* no resume point: a fresh start */
    char resume[PATH_MAX];
    struct stat st;
    if (n < 0) {
        slurm_info("babysit: %s/.babysitter/resume.json is not a regular file of at most %d bytes; starting fresh", ckpt, RESUME_CAP);
    } else if (json_string(doc, (size_t)n, "path", resume, sizeof resume) != 0) {
        slurm_info("babysit: %s/.babysitter/resume.json is not valid; starting fresh", ckpt);
    } else if (stat(resume, &st) != 0) {
        slurm_info("babysit: %s/.babysitter/resume.json names no existing checkpoint; starting fresh", ckpt);
    } else {
        spank_setenv(sp, "BABYSIT_RESUME_FROM", resume, 1);
    }
    return 0;
}
#endif /* BABYSIT_PARSE_ONLY */
