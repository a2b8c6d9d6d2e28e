# make demo   render this checkout's template (HEAD and any uncommitted edits, not the latest
#             release tag) with its default answers into demo/ and train it
# make test   the whole test suite (what CI runs)
# make bench  the CPU benchmarks (bench/README.md); writes bench/RESULTS.md
# make test-floor  the rendered projects' tests and a short run under the lowest torch and
#             torchvision they declare (tests/floor.py; CI runs it after make test)
# make mutants  deliberate breakages of the template, each against the tests that should
#             notice it (tests/mutants.py); run before each release, not part of make test
# make upgrades  the upgrade matrix (tests/test_upgrades.py): a project of every release in
#             README.md's changes list, edited as users do, updated to this checkout; run
#             before each release (make test runs two of its cases: the oldest and newest)
# All install what they need into .venv first, on a machine with Python 3.10+ and git.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
READY := $(VENV)/.ready
BENCH_READY := $(VENV)/.bench-ready
BENCH_FLAGS ?= --threads 1
DEMO_EPOCHS ?= 4
JOBS ?= 2

.PHONY: demo test test-quick test-floor mutants upgrades lint bench bench-quick clean

$(READY): requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $@

demo: $(READY)
	rm -rf demo
	$(BIN)/copier copy --quiet --trust --defaults --vcs-ref HEAD . demo
	cd demo && ../$(BIN)/python train.py --epochs $(DEMO_EPOCHS)

test: $(READY)
	$(BIN)/python -m pytest -n $(JOBS) --durations=15

# Everything but the tests marked slow, for quick iterations.
test-quick: $(READY)
	$(BIN)/python -m pytest -n $(JOBS) -m "not slow"

# The lowest torch and torchvision of each rendered pyproject.toml, exactly, in environments of
# their own under $(VENV)-floor (kept for the next run): the project's tests, a run, a resume.
test-floor: $(READY)
	$(BIN)/python tests/floor.py --venvs $(VENV)-floor

# Every mutant of tests/mutants.py (MUTANTS=-k <word> for some): prints caught or missed for
# each, the score and the slowest, and fails unless every one is caught.
MUTANTS ?=
mutants: $(READY)
	$(BIN)/python tests/mutants.py $(MUTANTS)

# Every release of README.md's changes list with both answer sets, from this repository's git
# history (a full clone: the releases are tagged from the commits that the list records).
upgrades: $(READY)
	UPGRADES=all $(BIN)/python -m pytest -n $(JOBS) tests/test_upgrades.py

# Bench-only dependencies (Lightning, scikit-learn) into the same .venv, torch held at the
# installed release so that pip cannot swap it for another.
$(BENCH_READY): $(READY) bench/requirements.txt
	$(BIN)/python -m pip freeze | grep -E '^(torch|torchvision)==' > $(VENV)/bench-constraints.txt
	$(BIN)/python -m pip install --quiet -r bench/requirements.txt -c $(VENV)/bench-constraints.txt
	touch $@

# Every benchmark, under 40 minutes on 2 cores, into bench/RESULTS.md. Options for
# bench/run_all.py go in BENCH_FLAGS; one torch thread by default, which keeps the side-by-side
# ratios steady on a small machine (BENCH_FLAGS= for torch's own choice).
bench: $(BENCH_READY)
	$(BIN)/python bench/run_all.py $(BENCH_FLAGS)

# Tiny sizes, one repeat, a minute or two: checks that every benchmark still runs.
bench-quick: $(BENCH_READY)
	$(BIN)/python bench/run_all.py --quick $(BENCH_FLAGS)

lint: $(READY)
	$(BIN)/ruff check tests bench
	$(BIN)/ruff format --check tests bench

clean:
	rm -rf demo .pytest_cache
