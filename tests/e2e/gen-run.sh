#!/bin/sh
# gen-run.sh DIR STEPS LR [TENSORS]: write a run directory as the trainer leaves it (run.json,
# metrics.db with its four tables, checkpoint files named as ckpt/ holds them) without
# training, for the web pages' tests and benchmark: a loss that falls, a spike at 40% of the
# steps, a non-finite step at 60%, a resume at 70% and a device change at 80%, validation
# every twentieth of the run, 2 layers of 4 experts, TENSORS tensors (default 6) a step, and
# checkpoints at each tenth. Rows come from SQLite itself (recursive CTEs): a million steps
# take seconds. The file is as a run logged before metrics.db had step_sums, unless
# GEN_SUMMARIZE names build/bench_metrics_log: it then sums the steps table up as the trainer
# does after each step (kiln_run_metrics_summarize, runs/metrics.c).
set -eu
D=$1 N=$2 LR=$3 NT=${4:-6}
mkdir -p "$D/ckpt"
cat >"$D/run.json" <<JSON
{"format": "kiln-run/1", "run_id": "gen-$N-$LR", "created": "2026-12-01T00:00:00Z",
 "kiln_version": "gen-run.sh", "dataset_sha256": "0000000000000000000000000000000000000000000000000000000000000000",
 "dataset_path": "generated",
 "config": {"steps": $N, "lr": $LR, "n_layers": 2, "n_experts": 4, "d_model": 16, "seed": 1}}
JSON
SP=$((N * 4 / 10)) NF=$((N * 6 / 10)) RS=$((N * 7 / 10)) DV=$((N * 8 / 10)) VE=$((N / 20))
[ "$VE" -ge 1 ] || VE=1
sqlite3 "$D/metrics.db" >/dev/null <<SQL
PRAGMA journal_mode=WAL;
CREATE TABLE steps( step INTEGER PRIMARY KEY, time REAL, loss REAL, mse REAL, load_balance REAL,
 z REAL, lr REAL, grad_norm REAL, applied INTEGER, tokens_per_s REAL, max_abs_output REAL,
 val_loss REAL, val_r2 REAL);
CREATE TABLE layers( step INTEGER, layer INTEGER, attn_entropy REAL, router_entropy REAL,
 load_imbalance REAL, dead_experts INTEGER, overflow REAL, act_rms REAL, expert_load TEXT,
 PRIMARY KEY(step, layer));
CREATE TABLE tensors( step INTEGER, name TEXT, grad_norm REAL, update_ratio REAL,
 PRIMARY KEY(step, name));
CREATE TABLE events( id INTEGER PRIMARY KEY, step INTEGER, time REAL, kind TEXT, message TEXT);
BEGIN;
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < $N),
 r AS (SELECT i, (abs(random()) % 1000) / 1000.0 AS u FROM s)
INSERT INTO steps SELECT i, 1.7e9 + i * 0.01,
 CASE WHEN i = $NF THEN NULL WHEN i = $SP THEN 40.0 ELSE 2.0 * exp(-6.0 * i / $N) + 0.02 + 0.02 * u END,
 CASE WHEN i = $NF THEN NULL ELSE 1.9 * exp(-6.0 * i / $N) + 0.015 + 0.02 * u END,
 0.01 + 0.002 * u, 0.001 * (1 + u), $LR * min(1.0, i * 20.0 / $N),
 CASE WHEN i = $NF THEN NULL WHEN i = $SP THEN 50.0 ELSE 0.5 + 0.3 * u END,
 i != $NF, 100000 + 1000 * u, 3 + u,
 CASE WHEN i % $VE = 0 THEN 2.0 * exp(-5.0 * i / $N) + 0.05 + 0.1 * $LR END,
 CASE WHEN i % $VE = 0 THEN 0.9 - 0.8 * exp(-5.0 * i / $N) END
FROM r;
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < $N),
 l(k) AS (VALUES (0), (1))
INSERT INTO layers SELECT i, k, 2.0 - exp(-3.0 * i / $N), 1.3 - 0.2 * k * i / $N,
 1.1 + 0.3 * k * i / $N + CASE WHEN i = $SP THEN 2.0 ELSE 0 END,
 CASE WHEN k = 1 AND i > $N * 9 / 10 THEN 1 ELSE 0 END, 0.01 * k, 1.0 + 0.1 * k,
 printf('[%.4f,%.4f,%.4f,%.4f]', 0.25 + 0.1 * k * i / $N, 0.25, 0.25 - 0.1 * k * i / $N,
        CASE WHEN i = $SP THEN 0.9 ELSE 0.25 END)
FROM s, l;
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < $N),
 t(k, name) AS (SELECT 0, 'embed.weight' UNION ALL SELECT k + 1, 'blocks.' || (k / 3) || '.' ||
   CASE k % 3 WHEN 0 THEN 'attn.w' WHEN 1 THEN 'router.w' ELSE 'ffn.w' END FROM t WHERE k + 1 < $NT)
INSERT INTO tensors SELECT i, name,
 CASE WHEN i = $NF AND k = 0 THEN NULL ELSE 0.1 * (k + 1) + CASE WHEN i = $SP THEN 5.0 ELSE 0 END END,
 1e-4 * (k + 1) * (1 + 2 * exp(-4.0 * i / $N))
FROM s, t;
INSERT INTO events(step, time, kind, message) VALUES
 (0, 1.7e9, 'start', 'started'),
 ($SP, 1.7e9 + $SP * 0.01, 'spike', 'step $SP: loss 40 (z 38.0), gradient norm 50 (z 41.2)'),
 ($NF, 1.7e9 + $NF * 0.01, 'nonfinite', 'step $NF: the loss is not finite: update skipped'),
 ($RS, 1.7e9 + $RS * 0.01, 'resume', 'resumed from step $RS'),
 ($DV, 1.7e9 + $DV * 0.01, 'device_change', 'cpu -> cuda:0');
COMMIT;
SQL
[ -z "${GEN_SUMMARIZE:-}" ] || "$GEN_SUMMARIZE" summarize "$D/metrics.db"
for k in 1 2 3 4 5 6 7 8 9 10; do
    : >"$D/ckpt/step-$(printf %08d $((N * k / 10))).safetensors"
done
