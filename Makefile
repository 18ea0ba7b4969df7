# nmcmc: the README's commands. `make demo` and `make test` install what is missing first.
BUILD ?= build
JOBS ?= 2
export CCACHE_SLOPPINESS := pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_MAXSIZE := 5G
export CCACHE_BASEDIR := $(CURDIR)
# Ninja and a unity build (Note [Unity build] in CMakeLists.txt): the build's compile time.
CMAKE_FLAGS ?= -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_UNITY_BUILD=ON

.PHONY: all deps configure build test test-long demo ebm bench example reference clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# The whole suite: unit, statistical and CLI tests, then the installed-package example. The
# long checks (label "long": the posteriordb suite's samplers, minutes per posterior) run apart:
# `make test-long`. ctest runs JOBS tests at once, each with one intra-op thread (LibTorch's and
# OpenBLAS's default, one thread per core in every test, oversubscribes the cores: the same tests
# take a third longer on 2 vCPUs).
TEST_THREADS ?= 1
test: build
	cd $(BUILD) && OMP_NUM_THREADS=$(TEST_THREADS) ctest --output-on-failure -j$(JOBS) -LE long
	$(MAKE) --no-print-directory example

# posteriordb's reference posteriors sampled by NUTS and by the learned sampler with its
# defaults; every mean and sd within 5 of its standard error (scripts/posteriordb.py check).
# A build without the Python package has no long tests: that is an error, not a pass.
test-long: build
	cd $(BUILD) && ctest --output-on-failure --no-tests=error -L long

# Installs the library into $(BUILD)/install, builds the examples against it and runs them:
# custom_target (sample your own density) and train_custom_target (register it, train the
# learned sampler on it, sample, check the exact moments).
EXAMPLES = custom_target train_custom_target
example: build
	cmake --install $(BUILD) --prefix $(abspath $(BUILD))/install > /dev/null
	set -e; for e in $(EXAMPLES); do \
	  cmake -S examples/$$e -B $(BUILD)/examples/$$e -DCMAKE_PREFIX_PATH=$(abspath $(BUILD))/install -DCMAKE_BUILD_TYPE=Release > /dev/null; \
	  cmake --build $(BUILD)/examples/$$e -j$(JOBS); \
	  (cd $(BUILD)/examples/$$e && ./$$e); \
	done
	@out=$$(mktemp -d) && inst=$(abspath $(BUILD))/install && \
	  $$inst/bin/nmcmc sample --target icg --dim 4 --sampler nuts --chains 2 --warmup 100 --draws 100 -q -o $$out/run > /dev/null && \
	  NMCMC_PLOT_SCRIPT=$$inst/share/nmcmc/nmcmc_plot.py $$inst/bin/nmcmc report $$out/run && rm -rf $$out
	@py=$$(ls -d $(abspath $(BUILD))/install/lib/python3*/dist-packages 2>/dev/null | head -1); \
	if [ -n "$$py" ] && [ -d "$$py/nmcmc" ]; then \
	  cd /tmp && PYTHONPATH=$$py /usr/bin/python3 -c "import nmcmc; t = nmcmc.target('icg', dim=4); \
	    r = nmcmc.sample(t, 'nuts', chains=2, warmup=100, draws=100, progress=False); \
	    print('installed Python package nmcmc', nmcmc.__version__, 'from', nmcmc.__file__, '- draws', tuple(r.draws.shape))"; \
	fi

demo: build
	$(BUILD)/nmcmc demo --output demo_out

# The image EBM of paper section 4.2 on Fashion-MNIST, cpu profile: the MALA baseline (~25 min),
# then the learned sampler (~50 min) with both runs' curves in one figure. Reruns resume.
ebm: build
	$(BUILD)/nmcmc ebm train --profile cpu --sampler mala --output ebm_mala --resume
	$(BUILD)/nmcmc ebm train --profile cpu --sampler learned --output ebm --compare ebm_mala --resume

bench: build
	bash bench/run_baselines.sh

# Regenerates data/reference/*.json (long HMC runs; about 10 minutes in all).
reference: build
	for d in german australian heart; do $(BUILD)/nmcmc reference --dataset $$d; done

clean:
	rm -rf $(BUILD)
