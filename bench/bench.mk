# The nginx-path benchmark's load client (bench/nginx.sh runs
# `make -f bench/bench.mk`).  It links the engine library for its in-process
# mode, so it is built after `make build/libnalar.a`.

CC     ?= cc
CFLAGS  = -std=c11 -D_GNU_SOURCE -g -O2 -pthread -Isrc -Ikernels/cpu \
          -Ikernels/cuda -Wall -Wextra -Werror -Wno-unused-parameter
LDLIBS  = -lcrypto -ljansson -lutf8proc -lm -pthread

build/bench/nginx_load: bench/nginx_load.c bench/load_samples.c bench/load_samples.h \
                      build/libnalar.a $(wildcard src/*.h) bench/bench_time.h
	@mkdir -p build/bench
	$(CC) $(CFLAGS) bench/nginx_load.c bench/load_samples.c build/libnalar.a -o $@ $(LDLIBS)

# The same client linked with the CUDA backend (a build with NALAR_CUDA):
# its engine mode can run --backend cuda (bench/gpu-serve.sh).
NVCC      ?= $(firstword $(shell command -v nvcc 2>/dev/null) \
                         $(wildcard /usr/local/cuda/bin/nvcc))
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))

build/bench/nginx_load_cuda: bench/nginx_load.c bench/load_samples.c build/libnalar.a \
                             build/libnalar_cuda.a $(wildcard src/*.h) bench/bench_time.h
	@mkdir -p build/bench
	$(CC) $(CFLAGS) bench/nginx_load.c bench/load_samples.c -Wl,-u,nalar_cuda_backend_create \
	    build/libnalar_cuda.a build/libnalar.a -o $@ $(LDLIBS) \
	    -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 \
	    -lcublas -lcudart -lstdc++ -ldl -lrt

build/bench/grammar: bench/grammar.c build/libnalar.a $(wildcard src/*.h) bench/bench_time.h
	@mkdir -p build/bench
	$(CC) $(CFLAGS) -It/c bench/grammar.c build/libnalar.a -o $@ $(LDLIBS)

# The products alone, per weight type (bench/quant.sh)
build/bench/quant_kernels: bench/quant_kernels.c build/libnalar.a \
                           $(wildcard src/*.h) bench/bench_time.h $(wildcard kernels/cpu/*.h)
	@mkdir -p build/bench
	$(CC) $(CFLAGS) -O3 -march=native bench/quant_kernels.c \
	    build/libnalar.a -o $@ $(LDLIBS)

# The F16 panel product alone at small steps' widths (bench/README,
# "ITL target")
build/bench/panels: bench/panels.c build/libnalar.a $(wildcard src/*.h) bench/bench_time.h \
                    $(wildcard kernels/cpu/*.h)
	@mkdir -p build/bench
	$(CC) $(CFLAGS) -O3 -march=native bench/panels.c build/libnalar.a \
	    -o $@ $(LDLIBS)

# A Jinja chat template's render and tokenizing against the prefill
# (bench/template.sh)
build/bench/template: bench/template.c build/libnalar_api.a build/libnalar.a \
                      $(wildcard src/*.h) bench/bench_time.h $(wildcard api/*.h)
	@mkdir -p build/bench
	$(CC) $(CFLAGS) -Iapi -It/c bench/template.c build/libnalar_api.a \
	    build/libnalar.a -o $@ $(LDLIBS)

# Decode with LoRA adapters against base-only decode (bench/lora.sh)
build/bench/lora: bench/lora.c build/libnalar.a $(wildcard src/*.h) bench/bench_time.h \
                  $(wildcard kernels/cpu/*.h)
	@mkdir -p build/bench
	$(CC) $(CFLAGS) -O3 -march=native bench/lora.c build/libnalar.a -o $@ \
	    $(LDLIBS)

# Two model files compared tensor by tensor (bench/lora-peer.sh)
build/bench/lora_diff: bench/lora_diff.c build/libnalar.a $(wildcard src/*.h) bench/bench_time.h \
                       $(wildcard kernels/cpu/*.h)
	@mkdir -p build/bench
	$(CC) $(CFLAGS) bench/lora_diff.c build/libnalar.a -o $@ $(LDLIBS)

# The tiles' products alone, 8-bit against 16-bit (bench/README: the tiles)
build/bench/tiles: bench/tiles.c build/libnalar.a $(wildcard src/*.h) bench/bench_time.h \
                   $(wildcard kernels/cpu/*.h)
	@mkdir -p build/bench
	$(CC) $(CFLAGS) -O3 -march=native bench/tiles.c build/libnalar.a \
	    -o $@ $(LDLIBS)

# One token's products alone, 8-bit against 16-bit (bench/README: the
# one-token kernels)
build/bench/rows: bench/rows.c build/libnalar.a $(wildcard src/*.h) bench/bench_time.h \
                  $(wildcard kernels/cpu/*.h)
	@mkdir -p build/bench
	$(CC) $(CFLAGS) -O3 -march=native bench/rows.c build/libnalar.a \
	    -o $@ $(LDLIBS)

# Decode's products on two threads against a read loop over the same
# bytes (bench/README: what bounds decode)
build/bench/stream: bench/stream.c build/libnalar.a $(wildcard src/*.h) bench/bench_time.h \
                    $(wildcard kernels/cpu/*.h)
	@mkdir -p build/bench
	$(CC) $(CFLAGS) -O3 -march=native bench/stream.c build/libnalar.a \
	    -o $@ $(LDLIBS)

# x's codes alone, per activation mode (bench/README: x's codes per
# activation mode)
build/bench/xcodes: bench/xcodes.c build/libnalar.a $(wildcard src/*.h) \
                    bench/bench_time.h $(wildcard kernels/cpu/*.h)
	@mkdir -p build/bench
	$(CC) $(CFLAGS) -O3 -march=native bench/xcodes.c build/libnalar.a \
	    -o $@ $(LDLIBS)
