/* test_api_time.c - kiln.h's time and group columns and split for bindings (data/time_api.c):
 * a dataset written with times and groups reads back as kiln_dataset_open reads it, the split
 * is kiln_dataset_split_ex's range for range with the trainer's validation windows, and
 * columns a reader would refuse are refused before anything is written. (tests/python/
 * test_split.py holds them against kiln data import and kiln train; this is for ASan.) */
#include <stdlib.h>
#include <string.h>

#include "kiln.h"
#include "test.h"
#include "testutil.h"
#include "train_int.h"

KILN_TEST(api_time_groups_and_split) {
    enum { N = 300 };
    static float x[N], y[N];
    static int64_t tm[N];
    static int32_t gp[N];
    /* Two instruments: A 180 daily rows from day 0, B 120 from day 40. */
    for (int r = 0; r < N; r++) {
        x[r] = (float)r;
        y[r] = (float)(r % 7);
        gp[r] = r >= 180;
        tm[r] = (r < 180 ? r : 40 + (r - 180)) * 86400LL;
    }
    const char *names[2] = {"A", "B"}, *fn[1] = {"f"}, *tn[1] = {"t"};
    kiln_data_extra ex = {.time = tm,
                          .time_column = "date",
                          .group = gp,
                          .n_groups = 2,
                          .group_names = names,
                          .group_column = "sym"};
    char *p = kiln_test_path("g.safetensors");
    kiln_data *d = NULL;
    kiln_dataset *ds = NULL;
    kiln_split sp = {0};
    if (!CHECK("write", kiln_data_write_extra(p, N, 1, 1, x, y, fn, tn, &ex) == KILN_OK) ||
        !CHECK("open", kiln_data_open(p, &d) == KILN_OK && kiln_dataset_open(p, &ds) == KILN_OK))
        goto out;
    const char *tc = NULL, *gc = NULL;
    int ng = 0;
    const int64_t *t = kiln_data_time(d, &tc);
    const int32_t *g = kiln_data_groups(d, &ng, &gc);
    CHECK("time", t && !memcmp(t, tm, sizeof tm) && !strcmp(tc, "date"));
    CHECK("groups", g && !memcmp(g, gp, sizeof gp) && ng == 2 && !strcmp(gc, "sym"));
    CHECK("group names", !strcmp(kiln_data_group_name(d, 1), "B") && !kiln_data_group_name(d, 2) &&
                             !kiln_data_group_name(d, -1));
    CHECK("names kept", !strcmp(kiln_data_column(d, 1, 0), "t"));

    kiln_data_split_opts o = {.val_fraction = 0.25, .seq_len = 10, .purge_time = "5d"};
    kiln_data_range rg[2];
    size_t vs[256];
    kiln_data_split_info info;
    if (!CHECK("split", kiln_data_split(p, N, t, g, ng, &o, rg, vs, 256, &info) == KILN_OK))
        goto out;
    kiln_split_opts so = {.val_fraction = 0.25, .seq_len = 10, .purge_secs = 5 * 86400};
    if (!CHECK("the trainer's split", kiln_dataset_split_ex(ds, &so, &sp) == KILN_OK)) goto out;
    bool same = info.n_ranges == sp.n_ranges && info.train_rows == sp.train_rows &&
                info.val_rows == sp.val_rows && info.gap_rows == sp.gap_rows &&
                info.by_time == sp.by_time && info.val_from == sp.val_from;
    for (size_t k = 0; same && k < sp.n_ranges; k++)
        same = rg[k].train_begin == sp.ranges[k].train_begin &&
               rg[k].train_end == sp.ranges[k].train_end &&
               rg[k].val_begin == sp.ranges[k].val_begin && rg[k].val_end == sp.ranges[k].val_end;
    CHECK("range for range the trainer's", same);
    size_t want[256], nw = kiln_train_val_windows(&sp, 10, 256, want);
    CHECK("the trainer's validation windows",
          nw == info.n_val && nw > 0 && !memcmp(want, vs, nw * sizeof *vs));

    /* Refusals: columns a reader refuses, a bad duration, no room for a window. */
    int32_t bad_g[N];
    memcpy(bad_g, gp, sizeof bad_g);
    bad_g[100] = 1;
    CHECK("groups out of runs refused by the split",
          kiln_data_split(NULL, N, NULL, bad_g, 2, &o, rg, vs, 256, &info) == KILN_ERR_USAGE &&
              strstr(kiln_errmsg(), "'the dataset': tensor 'group' row 101 is 0"));
    kiln_data_extra bad = ex;
    bad.group = bad_g;
    char *q = kiln_test_path("bad.safetensors");
    CHECK("and by the writer, which writes nothing",
          kiln_data_write_extra(q, N, 1, 1, x, y, NULL, NULL, &bad) == KILN_ERR_USAGE &&
              strstr(kiln_errmsg(), "row 101") && !kiln_path_exists(q));
    int64_t back[N];
    memcpy(back, tm, sizeof back);
    back[5] = back[3];
    bad = (kiln_data_extra){.time = back};
    CHECK("a time going back refused",
          kiln_data_write_extra(q, N, 1, 1, x, y, NULL, NULL, &bad) == KILN_ERR_USAGE &&
              strstr(kiln_errmsg(), "goes back at row 5") && !kiln_path_exists(q));
    const char *one_name[2] = {"A", NULL};
    bad = ex;
    bad.group_names = one_name;
    CHECK("a group without a name refused",
          kiln_data_write_extra(q, N, 1, 1, x, y, NULL, NULL, &bad) == KILN_ERR_USAGE &&
              !kiln_path_exists(q));
    o.purge_time = "soon";
    CHECK("a bad purge_time refused",
          kiln_data_split(p, N, t, g, ng, &o, rg, vs, 256, &info) == KILN_ERR_USAGE &&
              strstr(kiln_errmsg(), "'soon' is not a duration"));
    o.purge_time = NULL;
    o.seq_len = 100;
    CHECK("no training window refused",
          kiln_data_split(p, N, t, g, ng, &o, rg, vs, 256, &info) == KILN_ERR_USAGE &&
              strstr(kiln_errmsg(), "no training window"));
    free(q);
out:
    kiln_split_release(&sp);
    kiln_dataset_free(ds);
    kiln_data_free(d);
    free(p);
}
