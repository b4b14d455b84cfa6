/*
 * A fake libnvidia-ml.so.1 for testing babysitter's GPU checks through the REAL pynvml binding
 * on machines without a GPU. Device state comes from a text file (path in $FAKE_NVML_STATE),
 * re-read whenever it changes, so a test can inject faults into a running agent. Writers must
 * replace the file atomically (temp + rename).
 *
 * State file: one `key=value` per line; `#` comments.
 *   init_error=<nvmlReturn>          nvmlInit fails with this (9 DRIVER_NOT_LOADED, 18 mismatch)
 *   driver_version=550.54.15
 *   count=<n>
 *   gpuN.<field>=<value>             name uuid serial pci lost temp temp_slowdown temp_shutdown
 *                                    sbe_volatile dbe_volatile sbe_aggregate dbe_aggregate
 *                                    retired_sbe retired_dbe retired_pending
 *                                    remap_corr remap_unc remap_pending remap_failure
 *                                    nvlinks nvlink_down (comma list) nvlink_errors
 *                                    nvlink_fields (0: this driver predates the NVLink state
 *                                    field; nvmlDeviceGetFieldValues answers NOT_SUPPORTED per
 *                                    field, as r535 does)
 *                                    pcie_gen pcie_gen_max pcie_width pcie_width_max
 *                                    clocks_event_reasons power_mw
 *                                    pcie_replays (field 94, NVML_FI_DEV_PCIE_REPLAY_COUNTER)
 *                                    recovery_action reset_status drain_and_reset
 *                                    recovery_fields recovery_rc (fields 230/226/227: see the
 *                                    recovery-action block)
 *   gpuN.err.<function>=<nvmlReturn> that function fails on that GPU (e.g. 3 NOT_SUPPORTED)
 *   delay.<function>=<seconds>       that function sleeps first (a hung driver)
 *   gpuN.delay=<seconds>             every call on that GPU sleeps first (one hung GPU);
 *   gpuN.delay.<function>=<seconds>  or only that function on it
 *   gpuN.event_types=<mask>          nvmlDeviceGetSupportedEventTypes (default 0xc1f: SBE, DBE,
 *                                    PState, XID, clock, DRAM retirement event/failure); registering
 *                                    a type outside the mask is NOT_SUPPORTED, as on real boards
 *   event.<seq>=<gpu>,<data>[,<type>] an event (type default 0x8 XID critical, data = the XID);
 *                                    seen by event sets registered for that type before it
 *   context_dir=<dir>                GPU contexts of real processes: a live process that holds
 *                                    <dir>/nvidiaN open (as a CUDA context holds /dev/nvidiaN)
 *                                    is a compute process of GPU N, listed after gpuN.procs
 *
 * Call counting: with $FAKE_NVML_CALLS set, the number of calls per NVML function is written
 * there (`<function> <count>` lines, atomically) at most once a second, at nvmlShutdown and at
 * unload (a process that ends with _exit never unloads it), so a benchmark can tell how many
 * driver calls an agent makes.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#include <poll.h>
#include <sys/inotify.h>
#include <libgen.h>
#include <dirent.h>
#include <limits.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_TIMEOUT = 10, NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18, NVML_ERROR_UNKNOWN = 999
};

#define MAX_GPUS 64
#define MAX_LINKS 36
#define MAX_EVENTS 256
#define MAX_KV 4096
#define VAL_LEN 128

typedef struct { int index; } fake_device;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t must be 68 bytes");

typedef struct {
    void *device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t (v2) must be 32 bytes");

typedef struct {
    unsigned long long types[MAX_GPUS];  /* event types registered per GPU */
    long last_seq;
} fake_event_set;

#define DEFAULT_EVENT_TYPES 0xc1fULL

/* ---- call counting (names are string literals: compared by pointer first) */
#define MAX_FNS 128
static const char *fn_names[MAX_FNS];
static unsigned long long fn_counts[MAX_FNS];
static int nfns;
static time_t last_dump;
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;

static void dump_counts_locked(void) {
    const char *path = getenv("FAKE_NVML_CALLS");
    if (!path) return;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    for (int i = 0; i < nfns; i++) fprintf(f, "%s %llu\n", fn_names[i], fn_counts[i]);
    fclose(f);
    rename(tmp, path);
}

static void count_call(const char *fn) {
    pthread_mutex_lock(&count_lock);
    int i;
    for (i = 0; i < nfns; i++)
        if (fn_names[i] == fn || strcmp(fn_names[i], fn) == 0) break;
    if (i == nfns && nfns < MAX_FNS) fn_names[nfns++] = fn;
    if (i < MAX_FNS) fn_counts[i]++;
    if (getenv("FAKE_NVML_CALLS")) {
        time_t now = time(NULL);
        if (now != last_dump) { last_dump = now; dump_counts_locked(); }
    }
    pthread_mutex_unlock(&count_lock);
}

__attribute__((destructor)) static void dump_at_exit(void) {
    pthread_mutex_lock(&count_lock);
    dump_counts_locked();
    pthread_mutex_unlock(&count_lock);
}

static fake_device devices[MAX_GPUS];
static char keys[MAX_KV][64];
static char vals[MAX_KV][VAL_LEN];
static int nkv;
static struct timespec loaded_mtime;
static off_t loaded_size = -1;
static ino_t loaded_ino;
static int initialized;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void load_state(void) {
    const char *path = getenv("FAKE_NVML_STATE");
    struct stat st;
    if (!path || stat(path, &st) != 0) { nkv = 0; loaded_size = -1; return; }
    if (st.st_mtim.tv_sec == loaded_mtime.tv_sec && st.st_mtim.tv_nsec == loaded_mtime.tv_nsec
        && st.st_size == loaded_size && st.st_ino == loaded_ino)
        return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    nkv = 0;
    char line[512];
    while (fgets(line, sizeof line, f) && nkv < MAX_KV) {
        line[strcspn(line, "\r\n")] = 0;
        if (line[0] == '#' || line[0] == 0) continue;
        char *eq = strchr(line, '=');
        if (!eq) continue;
        *eq = 0;
        snprintf(keys[nkv], sizeof keys[nkv], "%s", line);
        snprintf(vals[nkv], VAL_LEN, "%s", eq + 1);
        nkv++;
    }
    fclose(f);
    loaded_mtime = st.st_mtim;
    loaded_size = st.st_size;
    loaded_ino = st.st_ino;
}

static const char *get(const char *key) {
    for (int i = nkv - 1; i >= 0; i--)
        if (strcmp(keys[i], key) == 0) return vals[i];
    return NULL;
}

static const char *gget(int gpu, const char *field) {
    char k[96];
    snprintf(k, sizeof k, "gpu%d.%s", gpu, field);
    return get(k);
}

static long long gnum(int gpu, const char *field, long long dflt) {
    const char *v = gget(gpu, field);
    return v ? strtoll(v, NULL, 0) : dflt;
}

static int count(void) {
    const char *v = get("count");
    int n = v ? atoi(v) : 0;
    return n < 0 ? 0 : (n > MAX_GPUS ? MAX_GPUS : n);
}

/* common prologue for every call: reload state, apply delay and injected errors */
static nvmlReturn_t enter(const char *fn, int gpu) {
    char k[128];
    count_call(fn);
    pthread_mutex_lock(&lock);
    load_state();
    snprintf(k, sizeof k, "delay.%s", fn);
    const char *d = get(k);
    double delay = d ? atof(d) : 0;
    if (gpu >= 0) { /* one GPU's driver calls hang: every call on it, or one function */
        snprintf(k, sizeof k, "gpu%d.delay.%s", gpu, fn);
        const char *g = get(k);
        if (!g) {
            snprintf(k, sizeof k, "gpu%d.delay", gpu);
            g = get(k);
        }
        if (g) delay = atof(g);
    }
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!initialized) rc = NVML_ERROR_UNINITIALIZED;
    else if (gpu >= 0) {
        if (gpu >= count()) rc = NVML_ERROR_INVALID_ARGUMENT;
        else if (gnum(gpu, "lost", 0)) rc = NVML_ERROR_GPU_IS_LOST;
        else {
            snprintf(k, sizeof k, "gpu%d.err.%s", gpu, fn);
            const char *e = get(k);
            if (e) rc = atoi(e);
        }
    }
    pthread_mutex_unlock(&lock);
    if (delay > 0) usleep((useconds_t)(delay * 1e6));
    return rc;
}

static int dev_index(void *handle) {
    if (!handle) return -1;
    fake_device *d = (fake_device *)handle;
    if (d < devices || d >= devices + MAX_GPUS) return -1;
    return d->index;
}

#define DEVICE_ENTER(fn)                                         \
    int gpu = dev_index(device);                                 \
    if (gpu < 0) return NVML_ERROR_INVALID_ARGUMENT;             \
    nvmlReturn_t rc_ = enter(fn, gpu);                           \
    if (rc_ != NVML_SUCCESS) return rc_;

static nvmlReturn_t copy_str(char *buf, unsigned int len, const char *s) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, s);
    return NVML_SUCCESS;
}

/* ---- init / system */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    loaded_size = -1;
    load_state();
    const char *e = get("init_error");
    int err = e ? atoi(e) : 0;
    if (!err) initialized = 1;
    for (int i = 0; i < MAX_GPUS; i++) devices[i].index = i;
    pthread_mutex_unlock(&lock);
    return err;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) {
    initialized = 0;
    pthread_mutex_lock(&count_lock);
    dump_counts_locked();
    pthread_mutex_unlock(&count_lock);
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 15: return "GPU is lost";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t rc = enter("nvmlSystemGetDriverVersion", -1);
    if (rc) return rc;
    const char *v = get("driver_version");
    return copy_str(version, length, v ? v : "550.54.15");
}
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t rc = enter("nvmlSystemGetNVMLVersion", -1);
    if (rc) return rc;
    return copy_str(version, length, "12.550.54.15");
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    nvmlReturn_t rc = enter("nvmlSystemGetCudaDriverVersion", -1);
    if (rc) return rc;
    *v = 12040;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* ---- device lookup */
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    nvmlReturn_t rc = enter("nvmlDeviceGetCount_v2", -1);
    if (rc) return rc;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned int)count();  /* a lost GPU stays counted, as on real hardware */
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    nvmlReturn_t rc = enter("nvmlDeviceGetHandleByIndex_v2", (int)index);
    if (rc) return rc;
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, void **device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetIndex(void *device, unsigned int *index) {
    DEVICE_ENTER("nvmlDeviceGetIndex");
    *index = (unsigned int)gpu;
    return NVML_SUCCESS;
}

static void default_uuid(int gpu, char *out, size_t len) {
    snprintf(out, len, "GPU-fa6e0000-0000-4000-8000-%012d", gpu);
}

nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned int length) {
    DEVICE_ENTER("nvmlDeviceGetName");
    const char *v = gget(gpu, "name");
    return copy_str(name, length, v ? v : "NVIDIA H100 80GB HBM3");
}
nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
    DEVICE_ENTER("nvmlDeviceGetUUID");
    const char *v = gget(gpu, "uuid");
    char d[64];
    default_uuid(gpu, d, sizeof d);
    return copy_str(uuid, length, v ? v : d);
}
nvmlReturn_t nvmlDeviceGetSerial(void *device, char *serial, unsigned int length) {
    DEVICE_ENTER("nvmlDeviceGetSerial");
    const char *v = gget(gpu, "serial");
    char d[32];
    snprintf(d, sizeof d, "165000000%04d", gpu);
    return copy_str(serial, length, v ? v : d);
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
    nvmlReturn_t rc = enter("nvmlDeviceGetHandleByUUID", -1);
    if (rc) return rc;
    for (int i = 0; i < count(); i++) {
        char d[64];
        const char *v = gget(i, "uuid");
        default_uuid(i, d, sizeof d);
        if (strcmp(uuid, v ? v : d) == 0) {
            if (gnum(i, "lost", 0)) return NVML_ERROR_GPU_IS_LOST;
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

static void pci_of(int gpu, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof *pci);
    const char *v = gget(gpu, "pci");
    char d[32];
    /* typical HGX bus ids */
    static const unsigned buses[8] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};
    unsigned bus = gpu < 8 ? buses[gpu] : (unsigned)(0x10 + gpu);
    snprintf(d, sizeof d, "00000000:%02X:00.0", bus);
    snprintf(pci->busId, sizeof pci->busId, "%s", v ? v : d);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%.15s", pci->busId + 4);
    unsigned dom = 0, b = 0, dv = 0;
    sscanf(pci->busId, "%x:%x:%x", &dom, &b, &dv);
    pci->domain = dom; pci->bus = b; pci->device = dv;
    pci->pciDeviceId = 0x233010de;
    pci->pciSubSystemId = 0x16c110de;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *device, nvmlPciInfo_t *pci) {
    DEVICE_ENTER("nvmlDeviceGetPciInfo_v3");
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    pci_of(gpu, pci);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(void *device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}
nvmlReturn_t nvmlDeviceGetPciInfo(void *device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *busid, void **device) {
    nvmlReturn_t rc = enter("nvmlDeviceGetHandleByPciBusId_v2", -1);
    if (rc) return rc;
    for (int i = 0; i < count(); i++) {
        nvmlPciInfo_t p;
        pci_of(i, &p);
        if (strcasecmp(p.busId, busid) == 0) { *device = &devices[i]; return NVML_SUCCESS; }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* ---- health */
nvmlReturn_t nvmlDeviceGetTemperature(void *device, int sensor, unsigned int *temp) {
    DEVICE_ENTER("nvmlDeviceGetTemperature");
    (void)sensor;
    *temp = (unsigned int)gnum(gpu, "temp", 40);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTemperatureThreshold(void *device, int type, unsigned int *temp) {
    DEVICE_ENTER("nvmlDeviceGetTemperatureThreshold");
    /* 0 SHUTDOWN, 1 SLOWDOWN, 2 MEM_MAX, 3 GPU_MAX */
    if (type == 0) *temp = (unsigned int)gnum(gpu, "temp_shutdown", 92);
    else if (type == 1) *temp = (unsigned int)gnum(gpu, "temp_slowdown", 87);
    else if (type == 3) *temp = (unsigned int)gnum(gpu, "temp_gpu_max", 85);
    else return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(void *device, unsigned int *mw) {
    DEVICE_ENTER("nvmlDeviceGetPowerUsage");
    *mw = (unsigned int)gnum(gpu, "power_mw", 120000);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void *device, unsigned long long *r) {
    DEVICE_ENTER("nvmlDeviceGetCurrentClocksEventReasons");
    *r = (unsigned long long)gnum(gpu, "clocks_event_reasons", 0);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void *device, unsigned long long *r) {
    DEVICE_ENTER("nvmlDeviceGetCurrentClocksThrottleReasons");
    *r = (unsigned long long)gnum(gpu, "clocks_event_reasons", 0);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *device, int errorType, int counterType,
                                         unsigned long long *n) {
    DEVICE_ENTER("nvmlDeviceGetTotalEccErrors");
    /* errorType 0 corrected (SBE), 1 uncorrected (DBE); counterType 0 volatile, 1 aggregate */
    const char *f = errorType == 0 ? (counterType == 0 ? "sbe_volatile" : "sbe_aggregate")
                                   : (counterType == 0 ? "dbe_volatile" : "dbe_aggregate");
    *n = (unsigned long long)gnum(gpu, f, 0);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRetiredPages(void *device, int cause, unsigned int *pageCount,
                                       unsigned long long *addresses) {
    DEVICE_ENTER("nvmlDeviceGetRetiredPages");
    unsigned int n = (unsigned int)gnum(gpu, cause == 0 ? "retired_sbe" : "retired_dbe", 0);
    if (!pageCount) return NVML_ERROR_INVALID_ARGUMENT;
    if (!addresses || *pageCount < n) { *pageCount = n; return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS; }
    for (unsigned int i = 0; i < n; i++) addresses[i] = 0x1000ULL * (i + 1);
    *pageCount = n;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(void *device, int *pending) {
    DEVICE_ENTER("nvmlDeviceGetRetiredPagesPendingStatus");
    *pending = (int)gnum(gpu, "retired_pending", 0);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRemappedRows(void *device, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure) {
    DEVICE_ENTER("nvmlDeviceGetRemappedRows");
    *corr = (unsigned int)gnum(gpu, "remap_corr", 0);
    *unc = (unsigned int)gnum(gpu, "remap_unc", 0);
    *pending = (unsigned int)gnum(gpu, "remap_pending", 0);
    *failure = (unsigned int)gnum(gpu, "remap_failure", 0);
    return NVML_SUCCESS;
}

static int link_down(int gpu, unsigned int link) {
    const char *v = gget(gpu, "nvlink_down");
    if (!v) return 0;
    char buf[VAL_LEN];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ","))
        if ((unsigned int)atoi(t) == link) return 1;
    return 0;
}
/* ---- fabric block (issue #41 deliverable 2): an NVLink's state field value, 0 INACTIVE
 * 1 ACTIVE 2 SLEEP 3 ACTIVE_TRAFFIC_DISABLED (gpuN.nvlink_state.<link> overrides nvlink_down) */
static unsigned int link_state(int gpu, unsigned int link) {
    char f[48];
    snprintf(f, sizeof f, "nvlink_state.%u", link);
    long long st = gnum(gpu, f, -1);
    if (st >= 0) return (unsigned int)st;
    return link_down(gpu, link) ? 0 : 1;
}
/* ---- end fabric block */
nvmlReturn_t nvmlDeviceGetNvLinkState(void *device, unsigned int link, int *isActive) {
    DEVICE_ENTER("nvmlDeviceGetNvLinkState");
    long long links = gnum(gpu, "nvlinks", 18);
    if (link >= MAX_LINKS || (long long)link >= links) return NVML_ERROR_INVALID_ARGUMENT;
    *isActive = !link_down(gpu, link);
    return NVML_SUCCESS;
}
/* nvmlDeviceGetFieldValues: the NVLink link count (91) and per-link state (165, scopeId = link),
 * the two fields the agent batches into one call per GPU, and the PCIe replay counter (94, an
 * unsigned long long, whatever nvlink_fields says). Other fields: NOT_SUPPORTED per field. */
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType, nvmlReturn;
    unsigned long long value; /* nvmlValue_t: uiVal in the low half on little-endian */
} nvmlFieldValue_t;
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t must be 40 bytes");
enum {
    FI_NVLINK_LINK_COUNT = 91, FI_PCIE_REPLAY_COUNTER = 94, FI_NVLINK_GET_STATE = 165,
    VALUE_TYPE_UINT = 1, VALUE_TYPE_ULL = 3
};

/* ==== BEGIN recovery action (issue 41, "follow the driver"): fields 230, 226, 227 ==========
 *   gpuN.recovery_action=<0..7>   NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230), default 0 (none)
 *   gpuN.reset_status=<0|1>       NVML_FI_DEV_RESET_STATUS (226), default 0
 *   gpuN.drain_and_reset=<0|1>    NVML_FI_DEV_DRAIN_AND_RESET_STATUS (227), default 0
 *   gpuN.recovery_fields=<2|1|0>  which fields the driver has: 2 (default) all three (r550+);
 *                                 1 only 226/227 (an older driver: 230 NOT_SUPPORTED); 0 none
 *   gpuN.recovery_rc=<nvmlReturn> field 230 answers this error instead (a failed read)
 * Returns 1 when the field is one of these (answered), 0 otherwise. */
enum { FI_RESET_STATUS = 226, FI_DRAIN_AND_RESET_STATUS = 227, FI_GPU_RECOVERY_ACTION = 230 };
static int recovery_field(int gpu, nvmlFieldValue_t *v) {
    if (v->fieldId != FI_GPU_RECOVERY_ACTION && v->fieldId != FI_RESET_STATUS
        && v->fieldId != FI_DRAIN_AND_RESET_STATUS)
        return 0;
    long long have = gnum(gpu, "recovery_fields", 2);
    v->valueType = VALUE_TYPE_UINT;
    if (v->fieldId == FI_GPU_RECOVERY_ACTION) {
        long long rc = gnum(gpu, "recovery_rc", 0);
        v->nvmlReturn = have < 2 ? NVML_ERROR_NOT_SUPPORTED : (nvmlReturn_t)rc;
        if (v->nvmlReturn == NVML_SUCCESS)
            v->value = (unsigned long long)gnum(gpu, "recovery_action", 0);
    } else if (have < 1) {
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    } else {
        v->nvmlReturn = NVML_SUCCESS;
        v->value = (unsigned long long)gnum(
            gpu, v->fieldId == FI_RESET_STATUS ? "reset_status" : "drain_and_reset", 0);
    }
    return 1;
}
/* ==== END recovery action ================================================================ */

nvmlReturn_t nvmlDeviceGetFieldValues(void *device, int count, nvmlFieldValue_t *values) {
    DEVICE_ENTER("nvmlDeviceGetFieldValues");
    if (count < 0 || !values) return NVML_ERROR_INVALID_ARGUMENT;
    long long links = gnum(gpu, "nvlinks", 18);
    int fields = gnum(gpu, "nvlink_fields", 1) != 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
        v->latencyUsec = 0;
        v->valueType = VALUE_TYPE_UINT;
        v->value = 0;
        if (recovery_field(gpu, v)) continue; /* issue 41: the recovery-action block above */
        if (v->fieldId == FI_PCIE_REPLAY_COUNTER) {
            v->nvmlReturn = NVML_SUCCESS;
            v->valueType = VALUE_TYPE_ULL;
            v->value = (unsigned long long)gnum(gpu, "pcie_replays", 0);
        } else if (!fields || (v->fieldId != FI_NVLINK_LINK_COUNT && v->fieldId != FI_NVLINK_GET_STATE)) {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        } else if (v->fieldId == FI_NVLINK_LINK_COUNT) {
            v->nvmlReturn = NVML_SUCCESS;
            v->value = (unsigned long long)links;
        } else if ((long long)v->scopeId >= links || v->scopeId >= MAX_LINKS) {
            v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            v->nvmlReturn = NVML_SUCCESS;
            v->value = (unsigned long long)link_state(gpu, v->scopeId); /* fabric block */
        }
    }
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(void *device, unsigned int link, int counter,
                                             unsigned long long *value) {
    DEVICE_ENTER("nvmlDeviceGetNvLinkErrorCounter");
    long long links = gnum(gpu, "nvlinks", 18);
    if (link >= MAX_LINKS || (long long)link >= links) return NVML_ERROR_INVALID_ARGUMENT;
    (void)counter;
    char f[48];
    snprintf(f, sizeof f, "nvlink_errors.%u", link);
    *value = (unsigned long long)gnum(gpu, f, 0);
    return NVML_SUCCESS;
}
#define PCIE_FN(name, field, dflt)                                   \
    nvmlReturn_t name(void *device, unsigned int *v) {               \
        DEVICE_ENTER(#name);                                         \
        *v = (unsigned int)gnum(gpu, field, dflt);                   \
        return NVML_SUCCESS;                                         \
    }
PCIE_FN(nvmlDeviceGetCurrPcieLinkGeneration, "pcie_gen", 5)
PCIE_FN(nvmlDeviceGetMaxPcieLinkGeneration, "pcie_gen_max", 5)
PCIE_FN(nvmlDeviceGetCurrPcieLinkWidth, "pcie_width", 16)
PCIE_FN(nvmlDeviceGetMaxPcieLinkWidth, "pcie_width_max", 16)

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *u) {
    DEVICE_ENTER("nvmlDeviceGetUtilizationRates");
    u->gpu = (unsigned int)gnum(gpu, "util", 0);
    u->memory = 0;
    return NVML_SUCCESS;
}
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *m) {
    DEVICE_ENTER("nvmlDeviceGetMemoryInfo");
    m->total = 85899345920ULL;
    m->used = (unsigned long long)gnum(gpu, "mem_used", 0);
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}
/* nvmlProcessInfo_v2_t (pynvml's v3 alias): pid, usedGpuMemory, gpuInstanceId,
 * computeInstanceId -- 24 bytes with padding. `gpuN.procs=K`: K compute processes. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} fake_proc_info;
_Static_assert(sizeof(fake_proc_info) == 24, "nvmlProcessInfo_v2_t is 24 bytes");
/* Live processes holding <context_dir>/nvidia<gpu> open (at most `max` pids into `out`). */
static unsigned int context_pids(int gpu, unsigned int *out, unsigned int max) {
    char dir[VAL_LEN], want[PATH_MAX], path[PATH_MAX], target[PATH_MAX];
    pthread_mutex_lock(&lock);
    const char *d = get("context_dir");
    snprintf(dir, sizeof dir, "%s", d ? d : "");
    pthread_mutex_unlock(&lock);
    if (!dir[0]) return 0;
    snprintf(want, sizeof want, "%s/nvidia%d", dir, gpu);
    unsigned int n = 0;
    DIR *proc = opendir("/proc");
    if (!proc) return 0;
    struct dirent *p;
    while ((p = readdir(proc)) && n < max) {
        if (p->d_name[0] < '0' || p->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/fd", p->d_name);
        DIR *fds = opendir(path);
        if (!fds) continue;  /* gone, or not ours to read */
        struct dirent *f;
        while ((f = readdir(fds))) {
            if (f->d_name[0] == '.') continue;
            snprintf(path, sizeof path, "/proc/%s/fd/%s", p->d_name, f->d_name);
            ssize_t len = readlink(path, target, sizeof target - 1);
            if (len <= 0) continue;
            target[len] = 0;
            if (strcmp(target, want) == 0) {
                out[n++] = (unsigned int)atoi(p->d_name);
                break;
            }
        }
        closedir(fds);
    }
    closedir(proc);
    return n;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *n, void *infos) {
    DEVICE_ENTER("nvmlDeviceGetComputeRunningProcesses_v3");
    unsigned int procs = (unsigned int)gnum(gpu, "procs", 0);
    unsigned int holders[256];
    unsigned int nholders = context_pids(gpu, holders, 256);
    unsigned int total = procs + nholders;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    if (*n < total || (total && !infos)) {  /* the two-call size protocol */
        *n = total;
        return total ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    fake_proc_info *out = infos;
    for (unsigned int i = 0; i < total; i++) {
        out[i].pid = i < procs ? 4242 + i : holders[i - procs];
        out[i].usedGpuMemory = 1ULL << 30;
        out[i].gpuInstanceId = out[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *n = total;
    return NVML_SUCCESS;
}

/* ---- events */
static long max_seq(void) {
    long m = 0;
    for (int i = 0; i < nkv; i++)
        if (strncmp(keys[i], "event.", 6) == 0) {
            long s = atol(keys[i] + 6);
            if (s > m) m = s;
        }
    return m;
}

nvmlReturn_t nvmlEventSetCreate(void **set) {
    nvmlReturn_t rc = enter("nvmlEventSetCreate", -1);
    if (rc) return rc;
    fake_event_set *s = calloc(1, sizeof *s);
    if (!s) return NVML_ERROR_UNKNOWN;
    pthread_mutex_lock(&lock);
    s->last_seq = max_seq();
    pthread_mutex_unlock(&lock);
    *set = s;
    return NVML_SUCCESS;
}
static unsigned long long supported_types(int gpu) {
    const char *v = gget(gpu, "event_types");
    return v ? strtoull(v, NULL, 0) : DEFAULT_EVENT_TYPES;
}
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *device, unsigned long long *types) {
    DEVICE_ENTER("nvmlDeviceGetSupportedEventTypes");
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    *types = supported_types(gpu);
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceRegisterEvents(void *device, unsigned long long types, void *set) {
    DEVICE_ENTER("nvmlDeviceRegisterEvents");
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    fake_event_set *s = set;
    pthread_mutex_lock(&lock);
    unsigned long long ok = supported_types(gpu);
    if (types & ~ok) { pthread_mutex_unlock(&lock); return NVML_ERROR_NOT_SUPPORTED; }
    s->types[gpu] |= types;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned int timeoutms) {
    count_call("nvmlEventSetWait_v2");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    fake_event_set *s = set;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    /* Block on inotify (the state file is replaced by rename) instead of polling: a real driver
     * blocks in the kernel, and a polling fake would bill its own CPU to the agent. */
    int ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    const char *path = getenv("FAKE_NVML_STATE");
    if (ino >= 0 && path) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", path);
        if (inotify_add_watch(ino, dirname(dir), IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE) < 0) {
            close(ino);
            ino = -1;
        }
    }
    for (;;) {
        pthread_mutex_lock(&lock);
        load_state();
        long best = -1; int best_gpu = -1; long long best_data = 0;
        unsigned long long best_type = 0;
        for (int i = 0; i < nkv; i++) {
            if (strncmp(keys[i], "event.", 6) != 0) continue;
            long seq = atol(keys[i] + 6);
            int g = -1; long long ev_data = 0; unsigned long long type = 0x8ULL;
            int n = sscanf(vals[i], "%d,%lld,%lli", &g, &ev_data, (long long *)&type);
            if (n < 2) continue;
            if (seq <= s->last_seq || g < 0 || g >= MAX_GPUS) continue;
            if (!(s->types[g] & type)) continue;
            if (best < 0 || seq < best) {
                best = seq; best_gpu = g; best_data = ev_data; best_type = type;
            }
        }
        if (best >= 0) {
            s->last_seq = best;
            pthread_mutex_unlock(&lock);
            if (ino >= 0) close(ino);
            memset(data, 0, sizeof *data);
            data->device = &devices[best_gpu];
            data->eventType = best_type;
            data->eventData = (unsigned long long)best_data;
            return NVML_SUCCESS;
        }
        pthread_mutex_unlock(&lock);
        clock_gettime(CLOCK_MONOTONIC, &now);
        double ms = (now.tv_sec - start.tv_sec) * 1e3 + (now.tv_nsec - start.tv_nsec) / 1e6;
        if (ms >= timeoutms) { if (ino >= 0) close(ino); return NVML_ERROR_TIMEOUT; }
        if (ino >= 0) {
            struct pollfd pfd = { .fd = ino, .events = POLLIN };
            int left = (int)(timeoutms - ms) + 1;
            if (poll(&pfd, 1, left > 0 ? left : 1) > 0) {
                char buf[4096];
                while (read(ino, buf, sizeof buf) > 0) {}
            }
        } else {
            usleep(10000);
        }
    }
}
nvmlReturn_t nvmlEventSetFree(void *set) {
    free(set);
    return NVML_SUCCESS;
}

/* ==== fabric block (issue #41 deliverable 2: NVSwitch / NVL72 GPU fabric) ====
 *   gpuN.fabric_state=<n>    0 NOT_SUPPORTED (default) 1 NOT_STARTED 2 IN_PROGRESS 3 COMPLETED
 *   gpuN.fabric_status=<n>   an nvmlReturn_t: why training failed (default 0 SUCCESS)
 *   gpuN.fabric_clique=<n>   the clique id (default 0)
 *   gpuN.fabric_cluster=<hex> the cluster UUID, 32 hex digits (dashes skipped; default zeros)
 *   gpuN.fabric_health=<n>   the health mask (V struct only; default 0: nothing supported)
 *   gpuN.fabric_summary=<n>  the health summary (v3 struct only; default 0)
 * Struct layouts as pynvml 13's c_nvmlGpuFabricInfo_t / _v2_t / _v3_t. */
typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
} nvmlGpuFabricInfo_t;
_Static_assert(sizeof(nvmlGpuFabricInfo_t) == 28, "nvmlGpuFabricInfo_t must be 28 bytes");
typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
    unsigned int healthMask;
    unsigned char healthSummary; /* v3 only */
} nvmlGpuFabricInfoV_t;
_Static_assert(sizeof(nvmlGpuFabricInfoV_t) == 40, "nvmlGpuFabricInfo_v3_t must be 40 bytes");
#define FABRIC_INFO_V2 0x02000024u
#define FABRIC_INFO_V3 0x03000028u
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25

static void fabric_uuid(int gpu, unsigned char out[16]) {
    memset(out, 0, 16);
    const char *v = gget(gpu, "fabric_cluster");
    if (!v) return;
    int n = 0;
    for (const char *p = v; *p && n < 32; p++) {
        int d;
        if (*p >= '0' && *p <= '9') d = *p - '0';
        else if (*p >= 'a' && *p <= 'f') d = *p - 'a' + 10;
        else if (*p >= 'A' && *p <= 'F') d = *p - 'A' + 10;
        else continue;
        out[n / 2] |= (unsigned char)(n % 2 ? d : d << 4);
        n++;
    }
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(void *device, nvmlGpuFabricInfo_t *info) {
    DEVICE_ENTER("nvmlDeviceGetGpuFabricInfo");
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    fabric_uuid(gpu, info->clusterUuid);
    info->status = (nvmlReturn_t)gnum(gpu, "fabric_status", 0);
    info->cliqueId = (unsigned int)gnum(gpu, "fabric_clique", 0);
    info->state = (unsigned int)gnum(gpu, "fabric_state", 0);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(void *device, nvmlGpuFabricInfoV_t *info) {
    DEVICE_ENTER("nvmlDeviceGetGpuFabricInfoV");
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int version = info->version;
    if (version != FABRIC_INFO_V2 && version != FABRIC_INFO_V3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    fabric_uuid(gpu, info->clusterUuid);
    info->status = (nvmlReturn_t)gnum(gpu, "fabric_status", 0);
    info->cliqueId = (unsigned int)gnum(gpu, "fabric_clique", 0);
    info->state = (unsigned int)gnum(gpu, "fabric_state", 0);
    info->healthMask = (unsigned int)gnum(gpu, "fabric_health", 0);
    if (version == FABRIC_INFO_V3) info->healthSummary = (unsigned char)gnum(gpu, "fabric_summary", 0);
    return NVML_SUCCESS;
}
/* ==== end fabric block */
