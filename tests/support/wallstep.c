/* A wall clock that steps while monotonic time runs on, as an NTP step or a resumed VM
 * moves a real machine's: LD_PRELOAD this into a process, with WALLSTEP_FILE naming a file
 * that holds the offset in seconds ("217", "-217"). The file is read again at most every
 * 200 ms, so rewriting it steps the process's CLOCK_REALTIME (time.time, datetime.now).
 * libfaketime 0.9.10 cannot leave CLOCK_MONOTONIC alone without breaking Python's sleep. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static volatile long long offset_ns;
static volatile long long checked_ns;

static long long monotonic_ns(void) {
    struct timespec now;
    real_clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

static void look(void) {
    if (!real_clock_gettime)
        real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    long long now = monotonic_ns();
    if (checked_ns && now - checked_ns < 200000000LL)
        return;
    checked_ns = now;
    const char *path = getenv("WALLSTEP_FILE");
    FILE *file = path ? fopen(path, "r") : NULL;
    if (file) {
        double seconds;
        if (fscanf(file, "%lf", &seconds) == 1)
            offset_ns = (long long)(seconds * 1e9);
        fclose(file);
    }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    look();
    int answer = real_clock_gettime(id, ts);
    if (answer == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns;
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return answer;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t)
        *t = ts.tv_sec;
    return ts.tv_sec;
}
