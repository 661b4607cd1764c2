/*
 * validate.h - the validation gate: golden sets (make and check), inference parity and the
 * validation report that `kiln pack` reads ("passed"). docs/validation.md describes the
 * files, the checks and the thresholds with the reasoning behind their defaults.
 * Everything returns kiln_err; nothing prints or exits.
 */
#ifndef KILN_VALIDATE_H
#define KILN_VALIDATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

#define KILN_GOLDEN_FORMAT "kiln-golden/1"
#define KILN_VALIDATION_FORMAT "kiln-validation/1"
/* The validation fraction used when the model's card records none (the trainer's default). */
#define KILN_VALIDATE_DEFAULT_VAL_FRACTION 0.2

/* ---- thresholds (validate/thresholds.c: the one table of defaults) ---- */

/* One comparison's tolerance. With M the largest |b| of the reference, an element b and
 * its candidate a agree when |a - b| <= max(atol * M, rtol * |b|): rtol bounds the relative
 * error, atol (a fraction of the output scale, so a model's units do not matter) keeps
 * outputs near zero from failing on rounding. The check passes when at most max_outside
 * of the elements (a fraction, 0 = none) disagree. */
typedef struct kiln_tolerance {
    double rtol, atol, max_outside;
} kiln_tolerance;

typedef struct kiln_thresholds {
    kiln_tolerance golden;      /* golden.*: stored golden outputs, f32 model */
    kiln_tolerance golden_bf16; /* golden_bf16.*: stored golden outputs, bf16 model */
    kiln_tolerance parity;      /* parity.*: trainer forward vs runtime batch forward */
    kiln_tolerance stream;      /* stream.*: runtime batch vs streaming */
    kiln_tolerance bf16;        /* bf16.*: f32 model vs its bf16 export */
    kiln_tolerance cuda;        /* cuda.*: CPU vs CUDA */
    double baseline_rel;        /* baseline.rel_margin: held-out loss may exceed the
                                   baseline's by this fraction of it ... */
    double baseline_abs;        /* baseline.abs_margin: ... plus this much */
    double heldout_windows;     /* heldout.windows: held-out windows (an integer) */
    double ties_rtol;      /* ties.rtol: a router margin at or below this is a near-tie */
    double ties_max_share; /* ties.max_share: more rows than this near a tie, none excused */
    kiln_tolerance reference; /* reference.*: runtime batch vs a research framework's outputs
                                 (kiln validate --reference) */
} kiln_thresholds;

void kiln_thresholds_default(kiln_thresholds *t);
/* One "key=value" (--set): key from the table ("parity.rtol", "baseline.rel_margin", ...),
 * value a finite number in the key's range. Unknown keys and bad values are KILN_ERR_USAGE
 * naming the key; *t is unchanged then. */
kiln_err kiln_thresholds_set(kiln_thresholds *t, const char *assignment);
/* Every key and its value, as a new JSON object (NULL on allocation failure). */
json_t *kiln_thresholds_json(const kiln_thresholds *t);
/* The table, for documentation and --help: key i (NULL past the end), its default and
 * what it means. */
const char *kiln_thresholds_key(size_t i, double *def, const char **doc);

/* ---- comparisons ---- */

typedef struct kiln_compare {
    size_t n;            /* elements compared */
    size_t excused;      /* elements outside tolerance but excused (router near-ties) */
    double excused_max_rel; /* the largest relative error among them */
    double max_abs;      /* max |a - b| */
    double max_rel;      /* max |a - b| / max(|b|, M atol / rtol): <= rtol iff all agree */
    double frac_outside; /* share of elements with |a - b| > max(M atol, rtol |b|) */
    double scale;        /* M, max |b| */
    size_t worst;        /* index of the element with the largest relative error */
    bool nonfinite;      /* a NaN or infinity in a or b (never passes) */
    bool passed;         /* !nonfinite && frac_outside <= max_outside */
} kiln_compare;

/* Compare a (candidate) with b (reference), n elements each. */
void kiln_compare_f32(const float *a, const float *b, size_t n, const kiln_tolerance *tol,
                      kiln_compare *out);
/* The same, where element i outside tolerance is excused (counted in excused, not in
 * frac_outside, max_rel or worst) when excuse[i / group] is set; excuse NULL: none is. A
 * non-finite element is never excused. */
void kiln_compare_f32_excused(const float *a, const float *b, size_t n, const kiln_tolerance *tol,
                              const uint8_t *excuse, size_t group, kiln_compare *out);

/* ---- golden sets (validate/golden.c) ---- */

typedef struct kiln_golden_opts {
    const char *model;   /* model directory (or its model.safetensors) */
    const char *data;    /* dataset; the windows come from its held-out split */
    const char *out_dir; /* NULL: <model>/golden */
    int windows;         /* N >= 1 */
    uint64_t seed;       /* Philox key for the window choice (KILN_STREAM_GOLDEN) */
    double val_fraction; /* < 0: the card's lineage.config.val_fraction, else the default */
    bool force;          /* replace an existing golden set */
} kiln_golden_opts;

/* Draw N windows of seq_len rows from the held-out split of the data (the split the
 * trainer used, as validate takes it: the run's val_fraction, val_from, purge and seq_len,
 * every instrument of grouped data split alike), run the model (the runtime's batch
 * forward) and write <out>/golden.safetensors (inputs [N,S,F], targets [N,S,O], outputs
 * [N,S,O], loss [N]: each window's MSE) and <out>/golden.json (data digest, model digest,
 * seed, split, window starts). Window w is number (first 64 bits of Philox(seed,
 * KILN_STREAM_GOLDEN, c)) mod (windows that fit) among the windows inside one instrument's
 * validation rows, counted range after range (without instruments: val_begin + that), c
 * counting up from 0, a start already drawn skipped while distinct ones remain.
 * The same model, data and options give the same bytes. */
kiln_err kiln_golden_make(const kiln_golden_opts *opts);

/* ---- the validation run (validate/validate.c) ---- */

/* Which released model a baseline is, for the report's "baseline" (docs/validation.md): what
 * kiln release knows of the model it pulled and verified from the baseline channel. */
typedef struct kiln_validate_baseline_ref {
    const char *name, *version; /* the model and version */
    const char *digest;         /* its archive's "sha256:<hex>", NULL when unknown */
    const char *channel;        /* the channel it was pulled from, NULL when none */
    int64_t seq;                /* that channel's record seq, 0 when none */
} kiln_validate_baseline_ref;

typedef struct kiln_validate_opts {
    const char *model;    /* candidate model directory (with golden/) */
    const char *data;     /* dataset */
    const char *baseline; /* NULL, or the model in production (with golden/) */
    /* NULL: the report names the baseline by what its directory's manifest.json says (a
     * pulled or unpacked model has one), when that manifest lists the very model.safetensors
     * measured. Only read with baseline. */
    const kiln_validate_baseline_ref *baseline_ref;
    /* parity_f32_bf16: the candidate against bf16, by default a bf16 rounding of it made
     * here (as kiln release always did); bf16 names an export to compare against instead;
     * no_bf16 skips the check ("not run: skipped by --no-bf16"). One default for kiln
     * validate and kiln release, so that a model that validates also releases. */
    const char *bf16; /* NULL, or the candidate's bf16 export to compare against */
    bool no_bf16;     /* skip the check */
    const char *report; /* NULL: <model>/validation.json; "" = write none */
    const kiln_thresholds *thresholds; /* NULL: defaults */
    double val_fraction;               /* < 0: from the card, else the default */
    /* NULL, or REF.safetensors: "outputs" [W,S,O], what a research framework (kiln.torch)
     * computed on the inputs of the model's golden/golden.safetensors; the check
     * parity_reference holds the runtime's outputs to it (reference.* tolerance, router
     * near-ties excused as in the other parity checks). */
    const char *reference;
} kiln_validate_opts;

/* Run every check (docs/validation.md) and write the report (JSON: each check's figures,
 * thresholds and status "passed" | "failed" | "not run" with a reason, the tool version,
 * the data digest, the baseline validated against (null for none) and a top-level
 * "passed"). *report (may be NULL) receives it (a new
 * reference), also when checks failed. Returns KILN_OK when every check that ran passed,
 * KILN_ERR_VERIFY when one failed (the message lists the failed checks; each check's own
 * one-line reason is its "reason" in the report), another code when the checks could not
 * run (bad model, data, I/O). */
KILN_MUST_CHECK kiln_err kiln_validate_run(const kiln_validate_opts *opts, json_t **report);

#endif
