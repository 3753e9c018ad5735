# Nalar build.  `make` builds the engine library, build/nalar and (when the
# nginx source tree is installed) the nginx module; `make test` installs what
# is missing, builds and runs every test; `make run` builds what serving
# needs and serves conf.example, `make run-cluster` an edge and three nodes
# (conf.example.cluster); PORT=N moves either off 8080.
#
# Two flavours of the engine: build/obj/ (-O3, production: build/libnalar.a,
# build/nalar, the module) and build/asan/obj/ (ASan/UBSan, -fPIC, with the
# test hooks: build/asan/libnalar.a serves build/asan/nalar, the unit tests
# and the test module).  Each object has its own header dependencies (-MMD,
# build/.../*.d), and each flavour's flags are kept in a file
# (build/obj/flags, build/asan/flags) whose change recompiles that flavour.

CC       ?= cc
OPT      ?= -O3 -march=native
WARN     = -Wall -Wextra -Werror -Wno-unused-parameter
CFLAGS_COMMON = -std=c11 -D_GNU_SOURCE -ffp-contract=off -g -pthread -Isrc \
                -Ikernels/cpu -Ikernels/cuda $(WARN)
CFLAGS   = $(CFLAGS_COMMON) $(OPT) -fPIC
SAN      = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
# The ASan flavour is the test flavour: it alone compiles the test hooks
# (NALAR_TEST_HOOKS: src/engine_test.h, the nalar_test_* directives), which
# the production library, CLI and module never have.
TEST_HOOKS = -DNALAR_TEST_HOOKS
ASAN_CFLAGS = $(CFLAGS_COMMON) -O1 -march=native $(SAN) $(TEST_HOOKS) -fPIC
LDLIBS   = -lcrypto -ljansson -lutf8proc -lm -pthread
DEPFLAGS = -MMD -MP
# make and prove run this many jobs in `make test` and `make run`
NPROC   := $(shell nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null \
                  || echo 1)

ENGINE_SRC = $(wildcard src/*.c) $(wildcard kernels/cpu/*.c) \
             $(wildcard kernels/cuda/*.c)
ENGINE_OBJ = $(patsubst %.c,build/obj/%.o,$(ENGINE_SRC))
ASAN_OBJ   = $(patsubst %.c,build/asan/obj/%.o,$(ENGINE_SRC))
TEST_SRC   = $(wildcard t/c/*.c)
TEST_BIN   = $(patsubst t/c/%.c,build/t/%,$(TEST_SRC))
# test_kv16 again for narrower instruction sets (the rule is below)
KV16_BIN   = build/t/test_kv16-avx2 build/t/test_kv16-avx2-nof16c \
             build/t/test_kv16-scalar
HDRS       = $(wildcard src/*.h) $(wildcard kernels/cpu/*.h) \
             $(wildcard kernels/cuda/*.h) $(wildcard api/*.h) $(wildcard t/c/*.h)

.PHONY: all serve test run run-cluster deps clean module fuzz bench FORCE

all: build/nalar build/asan/nalar $(TEST_BIN) $(KV16_BIN) \
     build/t/test_kq_decode_host module

# what serving needs: the production library, the CLI and the module
serve: build/nalar module

# A flavour's flags file is written only when its flags change (the
# recipe runs every time; make compares its date afterwards).
build/obj/flags: FORCE
	@mkdir -p $(@D)
	@echo '$(CFLAGS)' | cmp -s - $@ || echo '$(CFLAGS)' > $@
build/asan/flags: FORCE
	@mkdir -p $(@D)
	@echo '$(ASAN_CFLAGS)' | cmp -s - $@ || echo '$(ASAN_CFLAGS)' > $@
FORCE:

build/obj/%.o: %.c build/obj/flags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

build/asan/obj/%.o: %.c build/asan/flags
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $(DEPFLAGS) -c $< -o $@

# every object's and test program's dependency file, whichever library
# (src/, kernels/, api/) it belongs to
-include $(wildcard build/obj/*/*.d build/obj/*/*/*.d build/asan/obj/*/*.d \
                    build/asan/obj/*/*/*.d build/t/*.d)

build/libnalar.a: $(ENGINE_OBJ)
	@rm -f $@
	ar rcs $@ $^

build/asan/libnalar.a: $(ASAN_OBJ)
	@rm -f $@
	ar rcs $@ $^

# the CUDA kernels' block decoding built as host C++ (no GPU, no nvcc)
build/t/test_kq_decode_host: t/gpu/kq_decode_host.cc kernels/cuda/kq_decode.cuh \
                             build/libnalar.a
	@mkdir -p build/t
	$(CXX) -std=c++17 $(filter-out -std=c11,$(CFLAGS_COMMON)) -O2 -It/c \
	    $(DEPFLAGS) -MF $@.d t/gpu/kq_decode_host.cc build/libnalar.a \
	    -o $@ $(LDLIBS)

CLI_SRC = $(wildcard cli/*.c)
CLI_HDRS = $(wildcard cli/*.h)

# the CLI: the engine and the protocol layer (nalar render); its engine
# benchmarks share the C tests' collect() (t/c/collect.h)
build/nalar: $(CLI_SRC) $(CLI_HDRS) build/libnalar_api.a build/libnalar.a $(HDRS)
	$(CC) $(CFLAGS) -Icli -Iapi -It/c $(CLI_SRC) build/libnalar_api.a \
	    build/libnalar.a -o $@ $(LDLIBS)

build/asan/nalar: $(CLI_SRC) $(CLI_HDRS) build/asan/libnalar_api.a \
                  build/asan/libnalar.a $(HDRS)
	$(CC) $(ASAN_CFLAGS) -Icli -Iapi -It/c $(CLI_SRC) build/asan/libnalar_api.a \
	    build/asan/libnalar.a -o $@ $(LDLIBS)

# the unit tests of the engine and of the protocol layer: those that
# check memory safety (parsers of untrusted input, the engine's lifecycle,
# the KV pool and prefix cache, threads) link the ASan/UBSan flavour; the
# numeric and statistical ones (NUM_TESTS: a kernel's or a forward pass's
# values against a reference, a sampling distribution, the validity of
# many sampled values) link the optimized one, where they run about ten
# times faster.  What they run stays under ASan through other tests: every
# weight type and architecture through test_engine, test_engine_arch and
# test_spec; sampled speculation through test_spec; sampled structured
# output through test_grammar_engine, and each keyword's grammar walked
# byte by byte through test_grammar.  test_cpu_matmul stays under ASan: its
# awkward shapes are where a kernel would read past a row.
NUM_TESTS = test_conformance test_quant test_quant_q8 test_cpu_backend \
            test_spec_dist test_grammar_keywords
NUM_BIN   = $(patsubst %,build/t/%,$(NUM_TESTS))
# the list is kept in a file, as the flags are: a test that changes
# flavour is linked again
build/t/num-tests: FORCE
	@mkdir -p $(@D)
	@echo '$(NUM_TESTS)' | cmp -s - $@ || echo '$(NUM_TESTS)' > $@
$(NUM_BIN): build/t/%: t/c/%.c build/libnalar_api.a build/libnalar.a \
                       build/t/num-tests
	@mkdir -p build/t
	$(CC) $(CFLAGS) $(DEPFLAGS) -MF $@.d -It/c -Iapi $< \
	    build/libnalar_api.a build/libnalar.a -o $@ $(LDLIBS)

build/t/%: t/c/%.c build/asan/libnalar_api.a build/asan/libnalar.a \
           build/t/num-tests
	@mkdir -p build/t
	$(CC) $(ASAN_CFLAGS) $(DEPFLAGS) -MF $@.d -It/c -Iapi $< \
	    build/asan/libnalar_api.a build/asan/libnalar.a -o $@ $(LDLIBS)

# the 16-bit KV cache's loads and stores are chosen when compiled
# (kernels/cpu/cpu_kv16.h): test_kv16 again for AVX2 with F16C, AVX2
# without it and x86-64-v2, beside the machine's copy above
# (t/53-kv16-paths.t runs them)
build/t/test_kv16-avx2: ISA_FLAGS = -mno-avx512f
build/t/test_kv16-avx2-nof16c: ISA_FLAGS = -mno-avx512f -mno-f16c
build/t/test_kv16-scalar: ISA_FLAGS = -march=x86-64-v2
$(KV16_BIN): t/c/test_kv16.c
	@mkdir -p build/t
	$(CC) $(ASAN_CFLAGS) $(ISA_FLAGS) $(DEPFLAGS) -MF $@.d -It/c $< \
	    -o $@ $(LDLIBS)

# libFuzzer targets (clang only): fuzz/fuzz_NAME.c becomes build/fuzz_NAME,
# with its seed corpus in fuzz/corpus/NAME; each target lists the sources
# it links below.  `make fuzz` builds them; `make fuzz FUZZ_SECONDS=300`
# then runs each (or those named in FUZZ_ONLY) for that long, keeping what
# it finds in build/fuzz-corpus/NAME and any crash in build/fuzz-crash/.
FUZZ_BIN   = $(patsubst fuzz/%.c,build/%,$(wildcard fuzz/fuzz_*.c))
FUZZ_FLAGS = -std=c11 -D_GNU_SOURCE -g -O1 -Isrc -Iapi -I. \
             -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
build/fuzz_gguf: src/gguf.c src/nalar_err.c
build/fuzz_jwt: api/jwt.c src/nalar_err.c
build/fuzz_chat: api/chat.c api/chat_style.c api/chat.h src/nalar_err.c
TOKENIZER_SRC = src/tokenizer.c src/tokenizer_pretok.c src/tokenizer_merge.c \
                src/tokenizer_decode.c
build/fuzz_tokenizer: $(TOKENIZER_SRC) src/gguf.c src/nalar_err.c
build/fuzz_request: api/request.c api/request_scan.c api/request_tools.c \
                    api/error_json.c \
                    api/chat.c api/chat_style.c api/chat_template.c \
                    $(filter api/jinja%,$(wildcard api/*.c)) \
                    src/limits.c src/sampler.c \
                    $(wildcard src/grammar*.c) src/nalar_err.c $(TOKENIZER_SRC) \
                    src/gguf.c
build/fuzz_route: api/route_text.c
build/fuzz_grammar: $(wildcard src/grammar*.c) $(TOKENIZER_SRC) src/gguf.c \
                    src/nalar_err.c
build/fuzz_vocab_hf: src/vocab_hf.c $(TOKENIZER_SRC) src/gguf.c src/nalar_err.c
build/fuzz_lora: src/lora.c src/model.c $(TOKENIZER_SRC) src/gguf.c \
                 src/nalar_err.c

fuzz: $(FUZZ_BIN)
ifneq ($(FUZZ_SECONDS),)
	@sh scripts/fuzz.sh $(FUZZ_SECONDS) $(FUZZ_ONLY)
endif
build/fuzz_%: fuzz/fuzz_%.c $(HDRS)
	@mkdir -p build
	clang $(FUZZ_FLAGS) $(filter %.c,$^) -o $@ -lcrypto -ljansson -lutf8proc -lm

include module.mk
-include cuda.mk

deps:
	@sh scripts/deps.sh

# Module tests run again with the ASan/UBSan module (make module-asan):
# the request parsing, body reading, error, disconnect and auth paths
# the edge's stream filter, the hostile schemas' grammars and the chat
# templates rendered on the engine thread (hostile ones included), the
# LoRA adapter choice, about 3 minutes (its engine is about 10x slower).
# (t/53-parse-offloop.t and t/53-error-paths.t use test hooks, so they
# always run with it.)
ASAN_TESTS = t/50-module.t t/53-chunked-body.t t/53-errors.t \
             t/53-big-ids.t t/54-disconnect.t \
             t/67-jwt-auth.t t/73-edge-cut.t t/78-schema-hostile.t \
             t/83-chat-template.t t/87-lora-nginx.t

# Tests that compare one timing with another (a worker's measured pass
# time sets the stall it is given) run alone, after the parallel ones:
# a neighbour's load between the two measurements would change the answer.
SERIAL_TESTS = t/42-cpu-backend.t
PAR_TESTS    = $(filter-out $(SERIAL_TESTS),$(wildcard t/*.t))

# make and prove run in parallel (NPROC jobs); tests that start nginx each
# take their own free ports (t/lib/NalarTest.pm)
test: deps
	$(MAKE) -j$(NPROC) all fuzz module-asan
	prove -j$(NPROC) --timer $(PAR_TESTS)
	prove --timer $(SERIAL_TESTS)
	NALAR_ASAN=1 prove -j$(NPROC) --timer $(ASAN_TESTS)

# `make run` and `make run-cluster` build only what serving needs, in
# parallel, and say how long it took
run: deps
	@t0=$$(date +%s); $(MAKE) -j$(NPROC) serve && \
	    echo "run: build took $$(($$(date +%s) - t0)) s"
	sh scripts/run.sh

# three engine nodes and the edge that routes over them (conf.example.node,
# conf.example.cluster), all on 127.0.0.1
run-cluster: deps
	@t0=$$(date +%s); $(MAKE) -j$(NPROC) serve && \
	    echo "run-cluster: build took $$(($$(date +%s) - t0)) s"
	sh scripts/run-cluster.sh

clean:
	rm -rf build

# The protocol layer (api/: the OpenAI request and response shapes, chat
# rendering and templates, tools, JWT, the route key's scan; no nginx; it
# calls the engine, never the glue) as build/libnalar_api.a, linked into
# the module and the CLI, and its ASan/UBSan flavour for the unit tests and
# the test module.
API_SRC      = $(wildcard api/*.c)
API_HDRS     = $(wildcard api/*.h)
API_OBJ      = $(patsubst %.c,build/obj/%.o,$(API_SRC))
API_ASAN_OBJ = $(patsubst %.c,build/asan/obj/%.o,$(API_SRC))
build/libnalar_api.a: $(API_OBJ)
	@rm -f $@
	ar rcs $@ $^
build/asan/libnalar_api.a: $(API_ASAN_OBJ)
	@rm -f $@
	ar rcs $@ $^
all: build/libnalar_api.a build/asan/libnalar_api.a
build/fuzz_jinja: $(filter api/jinja%,$(API_SRC))
