# Shared by the fake Slurm clients (tests/slurm/fake/): a controller as slow as a loaded one.
# The cluster is a directory, $FAKE_SLURM_DIR: `jobs` holds one "ID|STATE|NODE|REASON" line
# per job (what squeue prints), `submitted` one "ID SCRIPT" line per sbatch, `next` the next
# job id. Each client answers after 1-3 s (FAKE_SLURM_DELAY="MIN MAX" in seconds to change
# it); its changes to the cluster are made under one flock, as a controller serialises them.
: "${FAKE_SLURM_DIR:?set FAKE_SLURM_DIR to the fake cluster's directory}"
mkdir -p "$FAKE_SLURM_DIR"
fake_delay() {
    sleep "$(awk -v r="${FAKE_SLURM_DELAY:-1 3}" -v s="$$" 'BEGIN { split(r, a, " "); srand(s); print a[1] + rand() * (a[2] - a[1]) }')"
}
