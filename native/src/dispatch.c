/*
 * Run-time dispatch: detect the CPU once at load, cap the level with TENSOROPS_ISA, and
 * resolve every kernel of TN_KERNEL_LIST into a table of function pointers. The table is
 * written before any kernel can run, and only read afterwards (except by
 * TnSetIsaForTesting, which the test suite calls between tests).
 */
#include <cpuid.h>
#include <stdlib.h>
#include <string.h>

#include "tensorops.h"
#include "kernels.h"

typedef struct {
    /* The formatter would take `void (*Name) params` for a call. */
    /* clang-format off */
#define TN_TABLE_FIELD(Name, params, args) void (*Name) params;
    /* clang-format on */
    TN_KERNEL_LIST(TN_TABLE_FIELD)
#undef TN_TABLE_FIELD
} TnKernelTable;

typedef struct {
    const char * name;
    int isa;
} TnKernelReport;

#define TN_COUNT_ONE(Name, params, args) +1
enum { TN_KERNEL_COUNT = 0 TN_KERNEL_LIST(TN_COUNT_ONE) };
#undef TN_COUNT_ONE

static TnKernelTable g_table;
static TnKernelReport g_report[TN_KERNEL_COUNT];
static uint64_t g_features;
static int g_supported;
static int g_active;

static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static uint64_t detect_features(void)
{
    unsigned a, b, c, d, max_leaf;
    uint64_t f = 0;
    if (!__get_cpuid(0, &max_leaf, &b, &c, &d))
        return 0;
    /* One feature bit a line. */
    /* clang-format off */
    __cpuid(1, a, b, c, d);
    if (c & (1u << 19)) f |= TnCpuSse41;
    if (c & (1u << 28)) f |= TnCpuAvx;
    if (c & (1u << 12)) f |= TnCpuFma;
    if (c & (1u << 29)) f |= TnCpuF16c;
    if (c & (1u << 27)) { /* OSXSAVE: the OS saves the vector state we may use */
        uint64_t xcr0 = read_xcr0();
        if ((xcr0 & 0x6) == 0x6) f |= TnCpuOsAvx;
        if ((xcr0 & 0xe6) == 0xe6) f |= TnCpuOsAvx512;
    }
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        if (b & (1u << 5)) f |= TnCpuAvx2;
        if (b & (1u << 16)) f |= TnCpuAvx512f;
        if (b & (1u << 17)) f |= TnCpuAvx512dq;
        if (b & (1u << 30)) f |= TnCpuAvx512bw;
        if (b & (1u << 31)) f |= TnCpuAvx512vl;
        if (c & (1u << 11)) f |= TnCpuAvx512vnni;
        if (d & (1u << 23)) f |= TnCpuAvx512fp16;
        unsigned max_sub = a;
        if (max_sub >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            if (a & (1u << 4)) f |= TnCpuAvxVnni;
            if (a & (1u << 5)) f |= TnCpuAvx512bf16;
        }
    }
    /* clang-format on */
    return f;
}

static int supported_level(uint64_t f)
{
    const uint64_t avx2 = TnCpuAvx | TnCpuAvx2 | TnCpuFma | TnCpuF16c | TnCpuOsAvx;
    const uint64_t avx512 = avx2 | TnCpuAvx512f | TnCpuAvx512bw | TnCpuAvx512vl | TnCpuAvx512dq | TnCpuOsAvx512;
    if ((f & avx512) == avx512)
        return TnIsaAvx512;
    if ((f & avx2) == avx2)
        return TnIsaAvx2;
    return TnIsaScalar;
}

/* TENSOROPS_ISA caps the level; an unknown value leaves it uncapped here (the Python
 * layer refuses it with a clear error before any kernel runs). */
static int requested_cap(void)
{
    const char * s = getenv("TENSOROPS_ISA");
    if (s == NULL || *s == '\0')
        return TnIsaAvx512;
    if (strcmp(s, "scalar") == 0)
        return TnIsaScalar;
    if (strcmp(s, "avx2") == 0)
        return TnIsaAvx2;
    return TnIsaAvx512;
}

/* Point every kernel at the best variant up to `level`, and record which one it got. */
static void resolve_kernels(int level)
{
    size_t i = 0;
#define TN_RESOLVE(Name, params, args) \
    if (level >= TnIsaAvx512 && tn_avx512_##Name) { \
        g_table.Name = tn_avx512_##Name; \
        g_report[i].isa = TnIsaAvx512; \
    } else if (level >= TnIsaAvx2 && tn_avx2_##Name) { \
        g_table.Name = tn_avx2_##Name; \
        g_report[i].isa = TnIsaAvx2; \
    } else { \
        g_table.Name = tn_scalar_##Name; \
        g_report[i].isa = tn_scalar_##Name ? TnIsaScalar : -1; \
    } \
    g_report[i++].name = #Name;
    TN_KERNEL_LIST(TN_RESOLVE)
#undef TN_RESOLVE
    g_active = level;
}

__attribute__((constructor)) static void tn_dispatch_init(void)
{
    g_features = detect_features();
    g_supported = supported_level(g_features);
    int cap = requested_cap();
    resolve_kernels(g_supported < cap ? g_supported : cap);
}

/* For the test suite only: it runs every level in one process instead of one process per
 * TENSOROPS_ISA value. The table is rewritten in place, so no kernel may be running. */
int TnSetIsaForTesting(int level)
{
    if (level < TnIsaScalar || level > g_supported)
        return -1;
    resolve_kernels(level);
    return 0;
}

int TnActiveIsa(void) { return g_active; }
int TnSupportedIsa(void) { return g_supported; }
uint64_t TnCpuFeatures(void) { return g_features; }
size_t TnKernelCount(void) { return TN_KERNEL_COUNT; }
const char * TnKernelName(size_t index) { return index < TN_KERNEL_COUNT ? g_report[index].name : NULL; }
int TnKernelIsa(size_t index) { return index < TN_KERNEL_COUNT ? g_report[index].isa : -1; }

#define TN_ENTRY_POINT(Name, params, args) \
    void Tn##Name params { g_table.Name args; }
TN_KERNEL_LIST(TN_ENTRY_POINT)
#undef TN_ENTRY_POINT
