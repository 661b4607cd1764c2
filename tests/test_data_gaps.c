/* test_data_gaps.c - the steps and gaps of a dataset's time column (kiln_time_steps_of,
 * data/timecol.c): a gap is a step clearly longer than the usual one (issue 30: every step of
 * a regular series was listed), and the times' extremes do not overflow a step. The series
 * of each kind go through the real binary in tests/e2e/10-data.sh. */
#include <stdint.h>
#include <stdlib.h>

#include "data.h"
#include "test.h"

/* A dataset of n rows at times t (no columns needed for the steps). */
static kiln_dataset with_times(int64_t *t, size_t n) {
    return (kiln_dataset){
        .rows = n, .n_features = 1, .n_outputs = 1, .path = (char *)"t", .time = t};
}

KILN_TEST(data_gaps_regular_series_have_none) {
    enum { N = 700 };
    int64_t *t = malloc(N * sizeof *t);
    if (!CHECK("alloc", t)) return;
    kiln_time_steps s;
    /* calendar-daily */
    for (size_t i = 0; i < N; i++)
        t[i] = (int64_t)i * 86400;
    kiln_dataset ds = with_times(t, N);
    CHECK("daily: none", kiln_time_steps_of(&ds, &s) == KILN_OK && s.n == N - 1 &&
                             s.median == 86400 && s.usual == 86400 && !s.n_gaps && !s.n_top);
    /* one day missing: one gap, ending the row after it */
    for (size_t i = 300; i < N; i++)
        t[i] += 86400;
    CHECK("daily, a day missing: one gap", kiln_time_steps_of(&ds, &s) == KILN_OK &&
                                               s.n_gaps == 1 && s.n_top == 1 && s.top[0] == 300);
    /* business-daily from a Monday (1970-01-05): weekends are usual */
    for (size_t i = 0; i < N; i++)
        t[i] = (int64_t)(4 + i / 5 * 7 + i % 5) * 86400;
    CHECK("business-daily: none", kiln_time_steps_of(&ds, &s) == KILN_OK && s.median == 86400 &&
                                      s.usual == 3 * 86400 && !s.n_gaps);
    /* a Friday (day 504: 504 % 5 == 4) missing: Thursday to Monday, 4 days, is over 5/4 of
     * the weekend; row 504 is then the Monday */
    for (size_t i = 0, j = 0; i < N - 1; j++)
        if (j != 504) t[i++] = (int64_t)(4 + j / 5 * 7 + j % 5) * 86400;
    ds.rows = N - 1;
    CHECK("business-daily, a Friday missing: one gap",
          kiln_time_steps_of(&ds, &s) == KILN_OK && s.usual == 3 * 86400 && s.n_gaps == 1 &&
              s.top[0] == 504 && t[504] - t[503] == 4 * 86400);
    /* a Wednesday (day 502) missing: Tuesday to Thursday, 2 days, shorter than the weekend,
     * is a gap in weekdays; the same series with one Saturday row is measured in steps again */
    for (size_t i = 0, j = 0; i < N - 1; j++)
        if (j != 502) t[i++] = (int64_t)(4 + j / 5 * 7 + j % 5) * 86400;
    CHECK("business-daily, a Wednesday missing: one gap",
          kiln_time_steps_of(&ds, &s) == KILN_OK && s.business && s.n_gaps == 1 &&
              s.top[0] == 502 && t[502] - t[501] == 2 * 86400);
    t[504] = t[503] + 86400; /* row 503 is day 504, a Friday: row 504 the Saturday after */
    ds.rows = 505;
    CHECK("a Saturday row: steps, no gap for the Wednesday",
          kiln_time_steps_of(&ds, &s) == KILN_OK && !s.business && s.n_gaps == 0);
    /* times before 1970 floor to their day: 1969-12-29 (Monday) to 1970-01-01 (Thursday) */
    int64_t pre[3] = {-3 * 86400 + 3600, -2 * 86400 + 3600, 3600};
    kiln_dataset dp = with_times(pre, 3);
    dp.rows = 3;
    CHECK("before 1970: weekdays floor",
          kiln_time_steps_of(&dp, &s) == KILN_OK && s.business && s.n_gaps == 1 && s.top[0] == 2);
    /* the times' extremes: the step is 2^64 - 1 seconds, not a negative number */
    int64_t ext[3] = {INT64_MIN, INT64_MIN + 1, INT64_MAX};
    kiln_dataset dx = with_times(ext, 3);
    CHECK("extremes: an unsigned step, a gap",
          kiln_time_steps_of(&dx, &s) == KILN_OK && s.first == INT64_MIN && s.last == INT64_MAX &&
              s.n == 2 && s.median == 1 && s.usual == 1 && s.n_gaps == 1 && s.top[0] == 2);
    free(t);
}

KILN_TEST(data_gaps_rule) {
    /* longer than 5/4 of the usual step and at least twice the median */
    CHECK("a missing day", kiln_time_step_is_gap(2 * 86400, 86400, 86400));
    CHECK("a weekend in business-daily data", !kiln_time_step_is_gap(3 * 86400, 86400, 3 * 86400));
    CHECK("a long weekend", kiln_time_step_is_gap(4 * 86400, 86400, 3 * 86400));
    CHECK("jitter is not a gap", !kiln_time_step_is_gap(5400, 3600, 3960));
    CHECK("no overflow", kiln_time_step_is_gap(UINT64_MAX, UINT64_MAX / 4, UINT64_MAX / 2) &&
                             !kiln_time_step_is_gap(UINT64_MAX, 1, UINT64_MAX));
}
