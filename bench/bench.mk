# The nginx-path benchmark's load client (bench/nginx.sh runs
# `make -f bench/bench.mk`).  It links the engine library for its in-process
# mode, so it is built after `make build/libnalar.a`.

CC     ?= cc
CFLAGS  = -std=c11 -D_GNU_SOURCE -g -O2 -pthread -Isrc -Ikernels \
          -Wall -Wextra -Werror -Wno-unused-parameter
LDLIBS  = -lcrypto -ljansson -lm -pthread

build/bench/nginx_load: bench/nginx_load.c build/libnalar.a $(wildcard src/*.h)
	@mkdir -p build/bench
	$(CC) $(CFLAGS) bench/nginx_load.c build/libnalar.a -o $@ $(LDLIBS)

build/bench/grammar: bench/grammar.c build/libnalar.a $(wildcard src/*.h)
	@mkdir -p build/bench
	$(CC) $(CFLAGS) -It/c bench/grammar.c build/libnalar.a -o $@ $(LDLIBS)
