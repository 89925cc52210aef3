/* The fake driver's collective kernel (fakecoll.c says what it models). */
#ifndef FAKECOLL_H
#define FAKECOLL_H
#include <stdint.h>

/* Run one collective (ncclDevKernel_AllReduce_Sum_f32_RING_LL) of ns on physical device phys: wait (spinning) for every peer's same step, then ns. */
void fakecoll_run(int phys, uint64_t ns);

/* fakecuda.c: a kernel's work, until CLOCK_MONOTONIC reaches end_ns (it sleeps most of it). */
void fake_busy_until(int64_t end_ns);

#endif
