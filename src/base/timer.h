/* Monotonic wall-clock time. */
#ifndef LILY_BASE_TIMER_H
#define LILY_BASE_TIMER_H

/* Seconds since an arbitrary fixed point (CLOCK_MONOTONIC). */
double lily_now(void);

#endif
