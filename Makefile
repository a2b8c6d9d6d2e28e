# make demo   render the template with its default answers into demo/ and train it
# make test   the whole test suite (what CI runs)
# Both install what they need into .venv first, on a machine with Python 3.10+ and git.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
READY := $(VENV)/.ready
DEMO_EPOCHS ?= 4
JOBS ?= 2

.PHONY: demo test test-quick lint clean

$(READY): requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $@

demo: $(READY)
	rm -rf demo
	$(BIN)/copier copy --quiet --trust --defaults . demo
	cd demo && ../$(BIN)/python train.py --epochs $(DEMO_EPOCHS)

test: $(READY)
	$(BIN)/python -m pytest -n $(JOBS) --durations=15

# Everything but the tests marked slow, for quick iterations.
test-quick: $(READY)
	$(BIN)/python -m pytest -n $(JOBS) -m "not slow"

lint: $(READY)
	$(BIN)/ruff check tests bench
	$(BIN)/ruff format --check tests bench

clean:
	rm -rf demo .pytest_cache
