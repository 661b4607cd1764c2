"""metrics.db's schema as a contract (docs/formats.md, "metrics.db"): what a real `kiln train`
creates is the documented schema, table for table, column for column (name, type, place in
the primary key), and every table and column python/kiln/_runs.py names exists in it, so
that the trainer, runs/ and the Python package, three readers of one file, cannot drift
apart unseen."""

import ast
import os
import re
import sqlite3

import fixtures_bindings as fx

DOC = os.path.join(fx.ROOT, "docs", "formats.md")
RUNS_PY = os.path.join(fx.ROOT, "python", "kiln", "_runs.py")


def doc_schema(path=DOC):
    """{table: [(column, type, key)]} from the doc's "## metrics.db" section: a "### `TABLE`"
    heading, then its rows "| `column` | TYPE | KEY | meaning |" (KEY: the place in the
    primary key, or empty)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^## metrics\.db\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"{path}: no '## metrics.db' section"
    out, table = {}, None
    for line in m.group(1).splitlines():
        h = re.match(r"^### `(\w+)`", line)
        if h:
            table = h.group(1)
            assert table not in out, f"{path}: table {table} documented twice"
            out[table] = []
            continue
        row = re.match(r"^\| `(\w+)` \| (\w+) \| *(\d*) *\|", line)
        if row and table:
            out[table].append((row.group(1), row.group(2), int(row.group(3) or 0)))
    assert out and all(out.values()), f"{path}: a metrics.db table without columns: {out}"
    return out


def db_schema(db):
    """{table: [(column, type, key)]} of a database, as PRAGMA table_info gives it."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        names = [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        return {t: [(r[1], r[2].upper(), r[5]) for r in con.execute(f'PRAGMA table_info("{t}")')]
                for t in names}
    finally:
        con.close()


def runs_py_names(path=RUNS_PY):
    """What _runs.py names of the schema, from its source: the tables it reads by name
    (self.metrics(("steps",)) and the like), the (table, column) pairs it compares against
    (("layers", "expert_load")), and the tables _internal() names exactly."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    tables, columns = set(), set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "metrics" and node.args
                and isinstance(node.args[0], ast.Tuple)):
            tables |= {e.value for e in node.args[0].elts if isinstance(e, ast.Constant)}
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if (isinstance(side, ast.Tuple) and len(side.elts) == 2
                        and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                for e in side.elts)):
                    columns.add((side.elts[0].value, side.elts[1].value))
        if isinstance(node, ast.FunctionDef) and node.name == "_internal":
            for sub in ast.walk(node):
                if (isinstance(sub, ast.Compare) and isinstance(sub.ops[0], ast.Eq)
                        and isinstance(sub.comparators[0], ast.Constant)):
                    tables.add(sub.comparators[0].value)
    return tables, columns


def test_runs_schema_doc_parses():
    """The doc reader finds the rows it must (so that the comparisons below can fail)."""
    doc = doc_schema()
    assert doc["steps"][0] == ("step", "INTEGER", 1), doc["steps"][:2]
    assert ("expert_load", "TEXT", 0) in doc["layers"]


def test_runs_schema_matches_doc():
    db = os.path.join(fx.run(), "metrics.db")
    real, doc = db_schema(db), doc_schema()
    assert sorted(real) == sorted(doc), \
        f"tables: the trainer makes {sorted(real)}, docs/formats.md says {sorted(doc)}"
    for t in sorted(real):
        assert real[t] == doc[t], (f"table {t}: the trainer makes {real[t]}, "
                                   f"docs/formats.md says {doc[t]}")


def test_runs_schema_covers_runs_py():
    db = os.path.join(fx.run(), "metrics.db")
    real, doc = db_schema(db), doc_schema()
    tables, columns = runs_py_names()
    # The source reader found what _runs.py is known to name (so that it can fail).
    assert {"steps", "layers", "tensors", "events", "tensor_names"} <= tables, tables
    assert ("layers", "expert_load") in columns, columns
    for t in tables:
        assert t in real and t in doc, f"_runs.py reads table {t!r}, not in metrics.db's schema"
    for t, c in columns:
        assert c in [r[0] for r in real.get(t, [])], \
            f"_runs.py reads column {t}.{c}, which `kiln train` does not create"
        assert c in [r[0] for r in doc.get(t, [])], \
            f"_runs.py reads column {t}.{c}, which docs/formats.md does not document"
    # Every other column it reads comes from PRAGMA table_info by declared type: each declared
    # type must be one _runs.py maps (anything else it would read as text).
    import kiln._runs as runs_py
    kinds = set(runs_py._KINDS)
    for t, cols in real.items():
        for c, ty, _ in cols:
            assert ty in kinds, f"{t}.{c} is declared {ty}, which _runs.py does not read"
