/*
 * Guarded shared mappings: a file mapped so that a SIGBUS inside it does not kill the
 * process (the server maps the shared-memory objects callers register, see
 * server/tensorops_server/shm.py and docs/kserve.md).
 *
 * A mapped file that shrinks while the process reads or writes it past its new end raises
 * SIGBUS, and nothing in POSIX pins the size of a shared-memory object. The SIGBUS handler
 * installed here looks the faulting address up in a table of the guarded mappings; inside
 * one, it maps anonymous zero pages over the whole mapping (MAP_FIXED, same address and
 * length) and marks it broken. The faulting instruction then runs again on the zero pages,
 * and whatever code touched the memory (a kernel, NumPy, memcpy, on any thread, with or
 * without the GIL) finishes without knowing; the caller checks TnGuardedBroken afterwards
 * and discards what that code computed. No code that reads or writes a mapping needs
 * wrapping, and a normal access costs nothing.
 *
 * The alternative, sigsetjmp/siglongjmp around each kernel call, would protect only the
 * kernels (not the NumPy copies and checks that also touch the memory), and jumping out of
 * a kernel skips whatever cleanup it has.
 *
 * mmap is not on POSIX's list of async-signal-safe functions, but on Linux it is a plain
 * system call with no user-space state, as the handler needs. A fault outside every
 * guarded mapping goes to the handler installed before this one (Python's faulthandler,
 * a sanitizer's), or to the default action, which kills the process as it would have.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "tensorops.h"

/* More mappings than the server's region caps allow: a mapping can outlive its region's
 * unregistration while arrays still view it. */
#define GUARD_SLOTS 4096

enum { SLOT_FREE = 0, SLOT_BUSY = 1, SLOT_ACTIVE = 2 };

typedef struct {
    atomic_int state;   /* the handler trusts start and length only when SLOT_ACTIVE */
    atomic_int broken;
    uintptr_t start;
    size_t length;
} GuardSlot;

static GuardSlot slots[GUARD_SLOTS];
static atomic_int slotsUsed;  /* one past the highest slot ever taken: the handler scans no further */
static struct sigaction previous;
static atomic_flag installing = ATOMIC_FLAG_INIT;

/* A fault outside every guarded mapping is not ours to mend: the handler installed before
 * this one is put back, and gets the fault when the instruction runs again, with its true
 * address, as if this one had never been there. That handler (faulthandler, a sanitizer's)
 * or the default action ends the process; had this handler called it instead, a handler
 * that re-raises after restoring its own predecessor (faulthandler does) would bring the
 * signal back here, in a loop. For the same reason a SIGBUS that was sent (by kill(), or
 * such a handler's raise()) gets the default action: the process ends. The next
 * TnGuardedMap installs this handler again. */
static void StandAside(int signo, const siginfo_t * info)
{
    if (info->si_code > 0) {
        sigaction(signo, &previous, NULL);
        return;
    }
    signal(signo, SIG_DFL);
    raise(signo);  /* delivered when the handler returns */
}

static void OnSigbus(int signo, siginfo_t * info, void * context)
{
    (void)context;
    if (info->si_code > 0) {  /* raised by a fault, not sent: si_addr is the faulting address */
        uintptr_t address = (uintptr_t)info->si_addr;
        int used = atomic_load_explicit(&slotsUsed, memory_order_acquire);
        for (int i = 0; i < used; ++i) {
            GuardSlot * slot = &slots[i];
            if (atomic_load_explicit(&slot->state, memory_order_acquire) != SLOT_ACTIVE)
                continue;
            if (address - slot->start >= slot->length)
                continue;
            void * zeros = mmap((void *)slot->start, slot->length, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            if (zeros == MAP_FAILED)
                break;
            atomic_store_explicit(&slot->broken, 1, memory_order_release);
            return;
        }
    }
    StandAside(signo, info);
}

/* Puts the handler in place unless it is there: at the first mapping, and again when
 * another handler took SIGBUS meanwhile (faulthandler enabled later, or the handler stood
 * aside for a fault of no mapping of its own), chaining to that one. */
static int Install(void)
{
    while (atomic_flag_test_and_set(&installing))
        ;
    struct sigaction current;
    int error = 0;
    if (sigaction(SIGBUS, NULL, &current) != 0)
        error = errno;
    else if (!((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == OnSigbus)) {
        struct sigaction ours;
        memset(&ours, 0, sizeof(ours));
        ours.sa_sigaction = OnSigbus;
        ours.sa_flags = SA_SIGINFO | SA_ONSTACK;  /* on a thread's alternate stack when it has one */
        sigemptyset(&ours.sa_mask);
        previous = current;
        if (sigaction(SIGBUS, &ours, NULL) != 0 || sigaction(SIGBUS, NULL, &current) != 0)
            error = errno;
        else if (current.sa_sigaction != OnSigbus)
            error = ENOTSUP;  /* refused without a word (a sanitizer run with handle_sigbus=2) */
    }
    atomic_flag_clear(&installing);
    return -error;
}

int TnGuardedMap(int fd, size_t size, void ** address)
{
    if (size == 0)
        return -EINVAL;
    int error = Install();
    if (error)
        return error;
    for (int i = 0; i < GUARD_SLOTS; ++i) {
        int expected = SLOT_FREE;
        if (!atomic_compare_exchange_strong(&slots[i].state, &expected, SLOT_BUSY))
            continue;
        void * mapped = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (mapped == MAP_FAILED) {
            int mapError = errno;
            atomic_store(&slots[i].state, SLOT_FREE);
            return -mapError;
        }
        slots[i].start = (uintptr_t)mapped;
        slots[i].length = size;
        atomic_store(&slots[i].broken, 0);
        int used = atomic_load(&slotsUsed);
        while (used < i + 1 && !atomic_compare_exchange_weak(&slotsUsed, &used, i + 1))
            ;
        atomic_store_explicit(&slots[i].state, SLOT_ACTIVE, memory_order_release);
        *address = mapped;
        return i;
    }
    return -ENOSPC;
}

int TnGuardedBroken(int slot)
{
    if (slot < 0 || slot >= GUARD_SLOTS)
        return 0;
    return atomic_load_explicit(&slots[slot].broken, memory_order_acquire);
}

void TnGuardedUnmap(int slot)
{
    if (slot < 0 || slot >= GUARD_SLOTS)
        return;
    int expected = SLOT_ACTIVE;
    if (!atomic_compare_exchange_strong(&slots[slot].state, &expected, SLOT_BUSY))
        return;
    /* Out of the handler's sight before the range is unmapped: once free, the range may be
     * mapped anew by anyone, and a fault there is no longer this mapping's. */
    munmap((void *)slots[slot].start, slots[slot].length);
    atomic_store(&slots[slot].state, SLOT_FREE);
}
