/* test_web_runs.c - the whole pages of kiln runs serve (web/run_page.c, web/runs_pages.c)
 * composed from plain values, without a run on disk or a server: a run whose name, events
 * and config are hostile shows them as text; both best marks (the best checkpoint and the
 * best validation, read off the curve) are named; a spike's mark links its explanation; a
 * chart of zeros is folded; the overlay, the explain page and the sweep from their structs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "test.h"
#include "testutil.h"
#include "web.h"

#define HOSTILE "<script>alert(1)</script>&\"'"
#define HOSTILE_ESCAPED "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#39;"
/* HOSTILE percent-encoded as a query value, then escaped in an attribute */
#define HOSTILE_PCT "%3Cscript%3Ealert%281%29%3C%2Fscript%3E%26%22%27"

static char *take(kiln_web_buf *b) {
    size_t len;
    return kiln_web_buf_take(b, &len);
}

/* Whether no raw markup from HOSTILE got through. */
static bool no_raw(const char *html) {
    return !strstr(html, "<script>") && !strstr(html, "alert(1)</script>");
}

static const double X[] = {1, 2, 3, 4, 5, 6, 7, 8};
static const double LOSS[] = {2.0, 1.5, 1.2, 1.0, 9.0, 0.8, NAN, 0.7};
static const double VAL[] = {NAN, 1.4, NAN, 1.1, NAN, 0.9, NAN, 0.95};
static const double R2[] = {NAN, 0.1, NAN, 0.4, NAN, 0.6, NAN, 0.55};
static const double ZERO[] = {0, 0, 0, 0, 0, 0, 0, 0};
static const double ENT[] = {1.3, 1.3, 1.2, 1.2, 1.1, 1.1, 1.0, 1.0};

static const kiln_web_series CURVES[] = {
    {"loss", X, LOSS, 8},       {"val_loss", X, VAL, 8},         {"val_r2", X, R2, 8},
    {"overflow@0", X, ZERO, 8}, {"router_entropy@0", X, ENT, 8},
};
static const long CKPTS[] = {4, 8};
static const kiln_web_event EVENTS[] = {
    {0, "start", "started"},
    {5, "spike", "step 5: loss 9 " HOSTILE},
    {7, "nonfinite", "step 7: the loss is not finite"},
    {6, "resume", "resumed from step 6"},
};
static const kiln_web_kv CONFIG[] = {{"lr", "0.001"}, {"opt.name", HOSTILE}};

static kiln_web_run_view run_view(void) {
    return (kiln_web_run_view){.name = HOSTILE,
                               .title = HOSTILE,
                               .run_id = "id-" HOSTILE,
                               .step = 8,
                               .steps = 10,
                               .state = "running",
                               .ckpts = CKPTS,
                               .n_ckpts = 2,
                               .best_ckpt = 4,
                               .n_spikes = 1,
                               .n_nonfinite = 1,
                               .total_events = 4,
                               .events = EVENTS,
                               .n_events = 4,
                               .config = CONFIG,
                               .n_config = 2,
                               .curves = CURVES,
                               .n_curves = KILN_ARRAY_LEN(CURVES),
                               .first = 1,
                               .last = 8,
                               .n_layers = 1};
}

KILN_TEST(web_runs_run_page) {
    kiln_web_run_view v = run_view();
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX};
    kiln_web_run_page(&b, &v, "/runs/" HOSTILE, 1.8e9);
    char *html = take(&b);
    if (!CHECK("the run page renders", html)) return;
    CHECK("a hostile name, event and config value are text", no_raw(html));
    CHECK("the title is escaped", strstr(html, "<h1>" HOSTILE_ESCAPED "</h1>"));
    CHECK("the config is listed, flattened keys as given",
          strstr(html, "<th>opt.name</th><td><code>" HOSTILE_ESCAPED "</code>"));
    CHECK("the progress row", strstr(html, "step 8 of 10, running</code>"));
    /* both best marks, on every chart drawn (loss, val_loss, val_r2, router entropy) */
    CHECK("the best checkpoint is marked on each chart",
          kiln_test_count(html, "<g class=\"mark best\">") == 4);
    CHECK("the best validation is marked on each chart",
          kiln_test_count(html, "<g class=\"mark best-val\">") == 4);
    CHECK("both are named", strstr(html, ">best ckpt</text>") && strstr(html, ">best val</text>"));
    CHECK("the best validation is read off the curve (the lowest, with its R2)",
          strstr(html, "<th>best validation</th><td><code>val_loss 0.9 at step 6, val_r2 0.6000"));
    CHECK("the checkpoints row names the best", strstr(html, "<code>4 (best) 8</code>"));
    CHECK("the start is no mark", !strstr(html, "start at step 0"));
    CHECK(
        "a spike's mark links its explanation, the name percent-encoded",
        strstr(html, "<a href=\"/explain?r=" HOSTILE_PCT "&amp;step=5\"><g class=\"mark spike\">"));
    CHECK("a resume is marked without a link", strstr(html, "<g class=\"mark resume\">"));
    CHECK("a chart of zeros is folded",
          strstr(html, "<p class=\"folded\" id=\"folded-overflow\">overflow (tokens past "
                       "capacity): 0 at every step logged (chart folded)</p>") &&
              !strstr(html, "id=\"chart-overflow\""));
    CHECK("the events table has a row each", kiln_test_count(html, "<tr class=\"event ") == 4);
    CHECK("the footer names the directory, escaped",
          strstr(html, "/runs/" HOSTILE_ESCAPED " read at"));
    free(html);

    /* Curves that could not be read: the reason, no chart; the table and config still. */
    v.curves_error = "no metrics.db: " HOSTILE;
    v.curves = NULL;
    v.n_curves = 0;
    b = (kiln_web_buf){0};
    kiln_web_run_page(&b, &v, "runs", 1.8e9);
    html = take(&b);
    if (!CHECK("the page without curves renders", html)) return;
    CHECK("it says why", strstr(html, "<p>no metrics.db: " HOSTILE_ESCAPED "</p>") && no_raw(html));
    CHECK("no chart and no best validation",
          !strstr(html, "<svg") && !strstr(html, "best validation"));
    CHECK("the events are still listed", kiln_test_count(html, "<tr class=\"event ") == 4);
    free(html);
}

KILN_TEST(web_runs_overlay_page) {
    static const kiln_web_series a[] = {{"loss", X, LOSS, 8}, {"lr", X, ENT, 8}};
    static const kiln_web_series c[] = {{"loss", X, ENT, 8}};
    const char *va[] = {"0.001"}, *vc[] = {NULL};
    kiln_web_overlay_run runs[] = {{HOSTILE, HOSTILE, a, 2, 1, 8, va}, {"b", "b", c, 1, 1, 8, vc}};
    const char *keys[] = {"lr"};
    kiln_web_overlay o = {runs, 2, 0.9, KILN_WEB_SCALE_AUTO, "seed=1 ", keys, 1};
    kiln_web_buf b = {0};
    kiln_web_overlay_page(&b, &o, "runs", 1.8e9);
    char *html = take(&b);
    if (!CHECK("the overlay renders", html)) return;
    CHECK("a hostile run's name is text", no_raw(html));
    CHECK("the title counts the runs", strstr(html, "<h1>2 runs overlaid</h1>"));
    CHECK("five charts, full width", kiln_test_count(html, "<svg class=\"chart\"") == 5);
    CHECK("the loss smoothed for both",
          kiln_test_count(html, "<polyline class=\"series smoothed\"") >= 2);
    CHECK("what differs: a row each, linked",
          strstr(html, "<a href=\"/run?r=" HOSTILE_PCT "\">" HOSTILE_ESCAPED "</a></td><td><code>"
                       "0.001</code>") &&
              strstr(html, "<a href=\"/run?r=b\">b</a></td><td><code>-</code>"));
    CHECK("what they share", strstr(html, "every run: seed=1 "));
    free(html);
}

KILN_TEST(web_runs_explain_and_sweep_pages) {
    kiln_web_kv findings[] = {{"spike", "the loss is 9x the median " HOSTILE}};
    kiln_web_explain_figure metrics[] = {{"loss", 9, 1.2, 7.5}, {"grad_norm", NAN, NAN, NAN}};
    kiln_web_explain_figure tensors[14];
    for (int i = 0; i < 14; i++)
        tensors[i] = (kiln_web_explain_figure){"t", 1, 1, 1};
    kiln_web_explain e = {HOSTILE, HOSTILE, 5, findings, 1, metrics, tensors, 2, 14, NULL, 0};
    kiln_web_buf b = {0};
    kiln_web_explain_page(&b, &e, "runs", 1.8e9);
    char *html = take(&b);
    if (!CHECK("the explain page renders", html)) return;
    CHECK("hostile text is text", no_raw(html));
    CHECK("titled with the step", strstr(html, "<h1>" HOSTILE_ESCAPED ", step 5: why</h1>"));
    CHECK("linked back to the run",
          strstr(html, "<a href=\"/run?r=" HOSTILE_PCT "\">back to the run</a>"));
    CHECK("a figure as kiln runs explain prints it",
          strstr(html, "<th>loss</th><td><code>9 (median 1.2, 7.5x)</code>"));
    CHECK("no figure is a dash",
          strstr(html, "<th>grad_norm</th><td><code>- (median -, -x)</code>"));
    CHECK("at most 12 tensors",
          kiln_test_count(html, "<th>t</th><td><code>gradient norm 1 (median 1, 1x)") == 12);
    free(html);

    const char *vals[] = {HOSTILE};
    kiln_web_run_row rows[] = {{.name = "a",
                                .state = "finished",
                                .loss = NAN,
                                .val_loss = NAN,
                                .val_r2 = NAN,
                                .varied = vals}};
    const char *varied[] = {"lr"};
    kiln_web_sweep sw = {"seed=1 ", varied, 1, 70, rows, 1};
    b = (kiln_web_buf){0};
    kiln_web_sweep_page(&b, &sw, "runs", 1.8e9);
    html = take(&b);
    if (!CHECK("the sweep renders", html)) return;
    CHECK("titled with the count", strstr(html, "<h1>1 run in runs</h1>"));
    CHECK("the varied value is text", no_raw(html) && strstr(html, "<td>" HOSTILE_ESCAPED "</td>"));
    CHECK("the keys left out are counted", strstr(html, "69 more config keys differ"));
    free(html);

    b = (kiln_web_buf){0};
    kiln_web_runs_error(&b, 404, HOSTILE, "runs", 1.8e9);
    html = take(&b);
    CHECK("an error page: the status, the message as text",
          html && strstr(html, "<h1>404</h1>") && strstr(html, "<p>" HOSTILE_ESCAPED "</p>") &&
              no_raw(html));
    free(html);
}
