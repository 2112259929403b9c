# dtrain — the two commands a new user needs, plus a few for developers.
#   make demo   install what is missing, build, train the default CNN on Fashion-MNIST
#   make test   install what is missing, build, run the whole test suite
#   make bench  dtrain vs PyTorch 1.13, back to back, with ratios
#   make bench-comm  allreduce vs Open MPI and Gloo
#   make bench-straggler  one worker throttled by a cgroup: dynamic shares, stealing
#   make bench-pipeline  pipeline stages on the deep MLP vs one process and PyTorch Pipe
#   make bench-ckpt  checkpoint cost, write speed vs dd and torch.save, resume time, kills
#   make bench-ps  parameter server vs ddp, PyTorch RPC PS, a straggler
#   make bench-obs  observability: overhead, scrape time, trace size
#   make bench-compress  gradient codecs: speed, one host, 3 emulated hosts at 100 Mbit/1 Gbit vs PyTorch hooks, accuracy with/without EF
#   make bench-elastic  elastic training: recovery time of 10 kills (one host and across 3 namespaces), steps lost, cost when nothing fails, standby replacement, launch --join
#   make bench-elastic-cost  elastic on/off while nothing fails: paired samples/s, CPU and switches per sample, elastic's own threads' share
#   make install [PREFIX=/usr/local]  the dtrain binary, libdtrain (.a, .so),
#                headers, dtrain.pc and the CMake package under PREFIX
JOBS ?= $(shell nproc)
BUILD ?= build/release
PREFIX ?= /usr/local

.PHONY: all build install demo test test-san test-tsan test-main bench bench-comm bench-straggler bench-pipeline bench-ckpt bench-ps bench-obs bench-compress bench-elastic bench-elastic-cost clean deps deps-test deps-bench

all: build

deps:
	@tools/setup-deps.sh build
deps-test:
	@tools/setup-deps.sh test
deps-bench:
	@tools/setup-deps.sh bench

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

demo: build
	$(BUILD)/dtrain train --out runs/demo

# Sanitizer builds run first; the main build's ctest runs last so its summary
# line ends the output.
test: deps-test test-san test-tsan test-main

test-san:
	@cmake -S . -B build/san -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
	  -DDT_NATIVE=ON -DDT_SANITIZE=address,undefined -DDT_FUZZ=ON >/dev/null
	@cmake --build build/san -j$(JOBS)
	cd build/san && ASAN_OPTIONS=detect_leaks=1 ctest -L "unit|fuzz" -j$(JOBS) --output-on-failure

test-tsan:
	@cmake -S . -B build/tsan -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
	  -DDT_SANITIZE=thread >/dev/null
	@cmake --build build/tsan -j$(JOBS)
	cd build/tsan && TSAN_OPTIONS=halt_on_error=1 ctest -L threads -j$(JOBS) --output-on-failure

test-main: build
	cd $(BUILD) && ctest -j$(JOBS) --output-on-failure

bench: deps-bench build
	BUILD=$(BUILD) bench/run.sh
	BUILD=$(BUILD) ACCURACY=1 bench/straggler.sh
	BUILD=$(BUILD) bench/pipeline.sh
	BUILD=$(BUILD) bench/ckpt.sh
	BUILD=$(BUILD) bench/ps.sh
	BUILD=$(BUILD) bench/obs.sh
	BUILD=$(BUILD) bench/compress.sh
	DTRAIN=$(BUILD)/dtrain bench/elastic.sh

# elastic training: recovery time (median of 10 kills), steps lost, cost when nothing fails
bench-elastic: build
	DTRAIN=$(BUILD)/dtrain bench/elastic.sh

# elastic training while nothing fails: on/off pairs (samples/s, CPU, context
# switches, instructions per sample where perf has them) and elastic's own threads
bench-elastic-cost: build
	DTRAIN=$(BUILD)/dtrain STRACE=1 bench/elastic_cost.sh

# parameter server: vs ddp, PyTorch's RPC parameter server, a throttled straggler
bench-ps: deps-bench build
	BUILD=$(BUILD) bench/ps.sh

# allreduce: dtrain (shm, tcp) vs Open MPI and Gloo, 2 and 4 ranks, back to back
bench-comm: deps-bench build
	BUILD=$(BUILD) bench/comm.sh

# one worker throttled by a cgroup CPU quota: static / dynamic / steal vs PyTorch DDP
bench-straggler: deps-bench build
	BUILD=$(BUILD) ACCURACY=1 bench/straggler.sh

# pipeline stages: speed-up, bubble, PyTorch Pipe, peak RSS (docs/pipeline.md)
bench-pipeline: deps-bench build
	BUILD=$(BUILD) bench/pipeline.sh

# checkpoints: cost every 200 steps, write speed vs dd/torch.save, resume time, 30 kills
bench-ckpt: deps-bench build
	BUILD=$(BUILD) bench/ckpt.sh

# observability: overhead of metrics + tracing, scrape time, trace size
bench-obs: deps-bench build
	BUILD=$(BUILD) bench/obs.sh

# gradient compression: codec speed, one host, 3 network namespaces with
# tc tbf at 100 Mbit/s and 1 Gbit/s, PyTorch DDP hooks, then the final
# accuracy of every codec with and without error feedback, then int8 against
# dense at 100 Mbit/s over 3 rounds with medians (docs/compress.md)
bench-compress: deps-bench build
	BUILD=$(BUILD) bench/compress.sh
	BUILD=$(BUILD) bench/compress_acc.sh
	BUILD=$(BUILD) bench/compress_int8.sh

clean:
	rm -rf build
