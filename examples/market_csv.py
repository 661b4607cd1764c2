#!/usr/bin/python3
"""market_csv.py OUT.csv A.csv B.csv C.csv: a real-shaped market file for `kiln data import`.

Each input is `kiln data export` of a synthetic market (one instrument; the same row count).
The output is what R's write.csv makes of daily data in long format: a quoted header with a
row-name column, then one row per (date, instrument), dates on business days from 1985-01-02
(weekends and one closure, 1985-09-27, missing), instruments SPX, NDX, RUT, numbers bare, a
few values NA (bare, as R writes them). tests/e2e/11-real-csv.sh and docs/data.md use it.
"""
import csv
import datetime
import sys

out, inputs = sys.argv[1], sys.argv[2:]
names = ["SPX", "NDX", "RUT", "DJI", "VIX"][: len(inputs)]
cols = [list(csv.reader(open(p))) for p in inputs]
rows = len(cols[0]) - 1
day, days = datetime.date(1985, 1, 2), []
while len(days) < rows:
    if day.weekday() < 5 and day != datetime.date(1985, 9, 27):  # Hurricane Gloria
        days.append(day)
    day += datetime.timedelta(days=1)
with open(out, "w", newline="") as f:
    w = csv.writer(f, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n")
    w.writerow(["", "date", "instrument"] + cols[0][0])
    n = 0
    for i, d in enumerate(days):
        for k, name in enumerate(names):
            n += 1
            cells = [str(n), d.isoformat(), name] + [float(v) for v in cols[k][i + 1]]
            if k == 1 and i % 250 == 7:
                cells[4] = "NA"  # a missing value in the second feature of the second instrument
            w.writerow(cells)
text = open(out).read().replace('"NA"', "NA")  # R leaves NA unquoted
open(out, "w").write(text)
