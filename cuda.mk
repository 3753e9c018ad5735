# CUDA backend: build/libnalar_cuda.a from kernels/cuda/*.cu (and the
# synthetic benchmark bench/cuda_bench.cu behind `nalar bench --synthetic`),
# linked into build/nalar (and build/asan/nalar), plus the op-by-op check
# program build/nalar-cuda-check (t/gpu/cuda_check*.c).  Included by the
# Makefile (`-include cuda.mk`).
#
# Found automatically: nvcc on PATH or /usr/local/cuda/bin/nvcc.  NALAR_CUDA=0
# turns it off, NALAR_CUDA=1 insists (and fails when nvcc is missing).
# No GPU is needed to compile.  With CUDA, the engine objects are compiled
# with -DNALAR_CUDA, so nalar_backend_create() offers "cuda" through a weak
# reference: binaries that do not link the CUDA library still link.

NVCC ?= $(firstword $(shell command -v nvcc 2>/dev/null) \
                    $(wildcard /usr/local/cuda/bin/nvcc))
ifeq ($(NALAR_CUDA),)
NALAR_CUDA := $(if $(NVCC),1,0)
endif

.PHONY: cuda

ifneq ($(NALAR_CUDA),0)
ifeq ($(NVCC),)
$(error NALAR_CUDA=1 but nvcc was not found; install the CUDA toolkit or set NVCC=/path/to/nvcc)
endif

CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCH  ?= -gencode arch=compute_90,code=sm_90 \
              -gencode arch=compute_80,code=compute_80
NVCCFLAGS  ?= -std=c++17 -O3 $(CUDA_ARCH) -Isrc -Ikernels/cpu \
              -Ikernels/cuda \
              -Xcompiler -fPIC,-Wall,-Wextra,-Werror,-Wno-unused-parameter \
              -Werror all-warnings
CUDA_SRC   = $(wildcard kernels/cuda/*.cu) bench/cuda_bench.cu
CUDA_OBJ   = $(patsubst %.cu,build/cuda/%.o,$(CUDA_SRC))
# cudart and cuBLAS shared, found at run time through the rpath; only what
# is referenced is kept (--as-needed)
CUDA_LIBS  = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 \
             -Wl,--push-state,--as-needed -lcublas -lcudart -Wl,--pop-state \
             -lstdc++ -ldl -lrt

CFLAGS_COMMON += -DNALAR_CUDA

cuda: build/libnalar_cuda.a build/nalar-cuda-check
all: build/libnalar_cuda.a build/nalar-cuda-check

# each object's header dependencies: build/cuda/.../*.d (nvcc -MMD); the
# flags in build/cuda/flags, as the C flavours' (Makefile)
build/cuda/flags: FORCE
	@mkdir -p $(@D)
	@echo '$(NVCC) $(NVCCFLAGS)' | cmp -s - $@ \
	    || echo '$(NVCC) $(NVCCFLAGS)' > $@

build/cuda/%.o: %.cu build/cuda/flags
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

-include $(CUDA_OBJ:.o=.d)

build/libnalar_cuda.a: $(CUDA_OBJ)
	@rm -f $@
	ar rcs $@ $^

# the CUDA archive needs engine symbols, so the engine archive follows it
build/nalar: build/libnalar_cuda.a
build/nalar: LDLIBS += -Wl,-u,nalar_cuda_backend_create \
    build/libnalar_cuda.a build/libnalar.a $(CUDA_LIBS)
build/asan/nalar: build/libnalar_cuda.a
build/asan/nalar: LDLIBS += -Wl,-u,nalar_cuda_backend_create \
    build/libnalar_cuda.a build/asan/libnalar.a $(CUDA_LIBS)
# both modules link it (`config`): built before them, so that the make that
# nginx's Makefile runs for it (config.make) finds it done
$(NGX_MODULE) $(NGX_MODULE_ASAN): build/libnalar_cuda.a

# (its parts, t/gpu/cuda_check*.c, compile in one command: every header
# they may read is a dependency)
CUDA_CHECK_SRC = $(wildcard t/gpu/cuda_check*.c)
build/nalar-cuda-check: $(CUDA_CHECK_SRC) t/gpu/cuda_check.h $(HDRS) \
                        $(wildcard kernels/cuda/*.cuh) \
                        build/libnalar_cuda.a build/libnalar.a
	$(CC) $(CFLAGS) -It/c -I$(CUDA_HOME)/include $(CUDA_CHECK_SRC) \
	    build/libnalar_cuda.a build/libnalar.a -o $@ $(LDLIBS) $(CUDA_LIBS)
else
cuda:
	@echo "cuda: nvcc not found (or NALAR_CUDA=0); the CUDA backend is not built"
endif
