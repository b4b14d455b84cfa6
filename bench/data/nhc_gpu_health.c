/*
 * The benchmark's stand-in for `nvidia-smi` as NHC's check_nvsmi_healthmon runs it
 * ($NVIDIA_SMI_HEALTHMON): a small C program over libnvidia-ml.so.1 (the fake one in the bench),
 * so an NHC run costs what it would with the real tool, not a Python start-up. It fails the way
 * the health monitor does: exit 15 when a GPU fell off the bus, 9 when the driver is not loaded,
 * 1 with a line naming the GPU for an uncorrected (volatile) ECC error, a row-remap failure or
 * pending remap, an inactive NVLink, or fewer GPUs than expected (argv[1], default 8).
 * Build: gcc -O2 -o nhc_gpu_health nhc_gpu_health.c -ldl
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*fn_void)(void);
typedef int (*fn_uint)(unsigned int *);
typedef int (*fn_handle)(unsigned int, void **);
typedef int (*fn_ecc)(void *, int, int, unsigned long long *);
typedef int (*fn_remap)(void *, unsigned int *, unsigned int *, unsigned int *, unsigned int *);
typedef int (*fn_link)(void *, unsigned int, int *);

enum { SUCCESS = 0, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, GPU_IS_LOST = 15 };

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        printf("NVML has no %s\n", name);
        exit(12);
    }
    return p;
}

int main(int argc, char **argv) {
    unsigned int expected = argc > 1 ? (unsigned int)atoi(argv[1]) : 8;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        printf("NVML shared library could not be found\n");
        return 12;
    }
    if (((fn_void)sym(lib, "nvmlInit_v2"))() != SUCCESS) {
        printf("NVIDIA driver not loaded\n");
        return 9;
    }
    fn_handle handle = (fn_handle)sym(lib, "nvmlDeviceGetHandleByIndex_v2");
    fn_ecc ecc = (fn_ecc)sym(lib, "nvmlDeviceGetTotalEccErrors");
    fn_remap remap = (fn_remap)sym(lib, "nvmlDeviceGetRemappedRows");
    fn_link link_state = (fn_link)sym(lib, "nvmlDeviceGetNvLinkState");
    unsigned int count = 0;
    ((fn_uint)sym(lib, "nvmlDeviceGetCount_v2"))(&count);
    int bad = 0;
    for (unsigned int i = 0; i < count; i++) {
        void *dev;
        int rc = handle(i, &dev);
        if (rc == GPU_IS_LOST) {
            printf("GPU %u has fallen off the bus\n", i);
            return 15;
        }
        if (rc != SUCCESS) {
            printf("GPU %u: NVML error %d\n", i, rc);
            bad = 1;
            continue;
        }
        unsigned long long dbe = 0;
        /* 1 = NVML_MEMORY_ERROR_TYPE_UNCORRECTED, 0 = NVML_VOLATILE_ECC */
        if (ecc(dev, 1, 0, &dbe) == SUCCESS && dbe > 0) {
            printf("GPU %u: %llu volatile uncorrected ECC errors\n", i, dbe);
            bad = 1;
        }
        unsigned int corr, unc, pending, failure;
        if (remap(dev, &corr, &unc, &pending, &failure) == SUCCESS && (pending || failure)) {
            printf("GPU %u: row remapping %s\n", i, failure ? "failed" : "pending");
            bad = 1;
        }
        for (unsigned int l = 0; l < 36; l++) {
            int active = 0;
            rc = link_state(dev, l, &active);
            if (rc == INVALID_ARGUMENT || rc == NOT_SUPPORTED) break;
            if (rc == SUCCESS && !active) {
                printf("GPU %u: NVLink %u is inactive\n", i, l);
                bad = 1;
            }
        }
    }
    if (count < expected) {
        printf("%u GPUs visible, %u expected\n", count, expected);
        bad = 1;
    }
    return bad;
}
