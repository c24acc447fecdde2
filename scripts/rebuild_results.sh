#!/usr/bin/env bash
# Rebuild every published table under results/ from its published run records alone (no training, no dataset), in
# place, and say which files differ from the committed ones. Exit 0 when every table rebuilt byte-identical, 1 when
# a file differs or a command failed (`git diff results/` shows how; `git checkout results/` undoes the rebuild).
#
#     bash scripts/rebuild_results.sh            # every table (about 4 minutes on 2 CPU cores)
#     bash scripts/rebuild_results.sh fairness   # only the folders under results/ whose path contains "fairness"
#
# What it runs, each as the page itself says it was made:
# - every `gastric-fl ablate ... --tables-only` line of a results/**/COMMAND.md (the runs' records are read from
#   the folder's cells.tar.xz, or from cells/ where unpacked);
# - scripts/privacy_table.py for results/privacy and results/honest_privacy (results.md, results.csv);
# - scripts/honest_compare.py and scripts/two_machines.py (results/honest_evaluation/tables.md, two_machines.md);
# - benchmarks/tables_compare.py (results/tables4567_*/beside_classic.md, as their WHERE.md says);
# - benchmarks/paired_settings.py (results/tables4567_*/paired_settings.md, and results/tables4567_quickstart/'s
#   paired_settings_fedamp.md, paired_settings_lam0.md, minus_separate.md and minus_fedavg.md);
# - benchmarks/paired_settings.py and benchmarks/hospital_paired.py for results/table7_label_skew_stride64/
#   (paired_settings.md: FedSAF's other settings minus its default; paired_settings_lam0.md: nhead 0 and 12 minus
#   nhead 6, at lambda 0; minus_separate.md, minus_fedavg.md, hospitals.md);
# - benchmarks/paired_settings.py --reference-grid for results/gastric_tissue/label_skew_stride64/separate_flattened/
#   minus_raw.md (Separate on the flattened tiles minus Separate on the raw ones, the Table 7 grid's runs);
# - benchmarks/hospital_paired.py (results/tables4567_quickstart/hospitals.md);
# - benchmarks/table7_rounds.py (results/table7_fmnist_*_rounds/rounds.md);
# - benchmarks/table7_data.py (results/table7_fmnist_pat2_data/data.md);
# - benchmarks/table7_paper.py (results/table7_fmnist_*/paper_row.md and .csv), compared without its "Machine:"
#   line, which records the load average when it was written.
# Not rebuilt here, since they need datasets or training: results/honest_evaluation/results.md and morphology.md,
# results/gastric_tissue/ (scripts/honest_evaluation.py, scripts/morphology_check.py) and the superseded
# results/earlier_benchmark_preset/ (no records published).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
ONLY=${1:-}
LOG=$(mktemp)
SCRATCH=$(mktemp -d)
trap 'rm -rf "$LOG" "$SCRATCH"' EXIT
failed=0

wanted() { [[ -z "$ONLY" || "$1" == *"$ONLY"* ]]; }

run() {
    echo "+ $*"
    if ! "$@" >"$LOG" 2>&1; then
        echo "FAILED: $*"
        tail -5 "$LOG"
        failed=1
    fi
}

# A methods folder's minus_separate.md and minus_fedavg.md (every setting minus Separate, minus FedAvg) and
# hospitals.md (each hospital against Separate); its Separate and FedAvg cells are strategy-<method><suffix>.
method_pages() {
    local folder=$1 suffix=$2
    for ref in separate fedavg; do
        run "$PY" benchmarks/paired_settings.py "$folder" --method strategy --reference "strategy-$ref$suffix" \
            --out "$folder/minus_$ref.md"
    done
    run "$PY" benchmarks/hospital_paired.py "$folder" --reference strategy-separate --out "$folder/hospitals.md"
}

# 1. Every ablation folder: the --tables-only command its COMMAND.md gives.
for page in results/*/COMMAND.md results/*/*/COMMAND.md; do
    [[ -f "$page" ]] && wanted "$(dirname "$page")" || continue
    line=$(grep -m1 -e "--tables-only" "$page") || continue
    read -r -a words <<<"${line#gastric-fl }"
    run "$PY" -m app.cli "${words[@]}"
done

# 2. The tables that scripts make from published folders.
for folder in results/privacy results/honest_privacy; do
    wanted "$folder" && run "$PY" scripts/privacy_table.py "$folder"
done
if wanted results/honest_evaluation; then
    run "$PY" scripts/honest_compare.py --out results/honest_evaluation/tables.md
    run "$PY" scripts/two_machines.py
fi
for regime in site_shift data_poor seed_like label_skew; do
    wanted "results/tables4567_$regime" || continue
    run "$PY" benchmarks/tables_compare.py "results/honest_tables456_$regime" "results/tables4567_$regime" \
        --labels "classic (raw, 3 seeds)" "gastric (5 seeds)" --out "results/tables4567_$regime/beside_classic.md"
done
for regime in seed_like label_skew; do
    wanted "results/tables4567_$regime" || continue
    run "$PY" benchmarks/paired_settings.py "results/tables4567_$regime" --reference strategy-fedsaf_fim-on_split-on \
        --out "results/tables4567_$regime/paired_settings.md"
done
if wanted results/tables4567_quickstart; then
    qs=results/tables4567_quickstart
    run "$PY" benchmarks/paired_settings.py "$qs" --reference strategy-fedsaf_rounds-10 --out "$qs/paired_settings.md"
    run "$PY" benchmarks/paired_settings.py "$qs" --method strategy-fedamp --reference strategy-fedamp_rounds-10 \
        --out "$qs/paired_settings_fedamp.md"
    run "$PY" benchmarks/paired_settings.py "$qs" --method strategy-fedsaf_lam-0.0_ \
        --reference strategy-fedsaf_lam-0.0_rounds-10 --out "$qs/paired_settings_lam0.md"
    method_pages "$qs" _rounds-10
fi
if wanted results/table7_label_skew_stride64; then
    skew=results/table7_label_skew_stride64
    run "$PY" benchmarks/paired_settings.py "$skew" --reference strategy-fedsaf --out "$skew/paired_settings.md"
    run "$PY" benchmarks/paired_settings.py "$skew" --method strategy-fedsaf_lam-0.0 \
        --reference strategy-fedsaf_lam-0.0 --out "$skew/paired_settings_lam0.md"
    method_pages "$skew" ""
fi
if wanted results/gastric_tissue/label_skew_stride64/separate_flattened; then
    flat=results/gastric_tissue/label_skew_stride64/separate_flattened
    run "$PY" benchmarks/paired_settings.py "$flat" --method strategy-separate --reference strategy-separate \
        --reference-grid results/table7_label_skew_stride64 --out "$flat/minus_raw.md"
fi
for name in table7_fmnist_pat2 table7_fmnist_pat2_mobilenet; do
    wanted "results/${name}_rounds" || continue
    run "$PY" benchmarks/table7_rounds.py "results/$name" "results/${name}_rounds" --out "results/${name}_rounds/rounds.md"
done
if wanted results/table7_fmnist_pat2_data; then
    run "$PY" benchmarks/table7_data.py results/table7_fmnist_pat2=7000 results/table7_fmnist_pat2_data=21000 \
        results/table7_fmnist_pat2_full=70000 --out results/table7_fmnist_pat2_data/data.md
fi
for name in table7_fmnist_pat10 table7_fmnist_pat2 table7_fmnist_pat2_mobilenet; do
    wanted "results/$name" || continue
    page=results/$name/paper_row.md
    cp "$page" "$SCRATCH/$name.md"
    run "$PY" benchmarks/table7_paper.py "results/$name" --out "$page"
    if diff -q <(grep -v "^Machine: " "$page") <(grep -v "^Machine: " "$SCRATCH/$name.md") >/dev/null; then
        cp "$SCRATCH/$name.md" "$page" # equal but for the machine's load when it was written
    fi
done

# 3. What differs from the committed files (and anything new, e.g. a folder unpacked by hand and not ignored), in
# the folders asked for.
changed=$(git status --porcelain --untracked-files=all -- results/ | grep -F -e "$ONLY")
if [[ -n "$changed" ]]; then
    echo "files that differ from the committed ones ($(wc -l <<<"$changed")):"
    echo "$changed"
    exit 1
fi
if [[ $failed -ne 0 ]]; then
    exit 1
fi
echo "every published table rebuilt byte-identical"
