/*
 * Engine-level benchmarks of the nalar tool (speculative decoding, prefix
 * cache).  They drive the engine exactly as the server does, through
 * requests, and report medians of alternating runs against a baseline
 * measured in the same process.
 */
#ifndef NALAR_CLI_BENCH_H
#define NALAR_CLI_BENCH_H

/* "off", "draft", "ngram", "auto" -> nalar_spec_mode, or -1 */
int nalar_bench_spec_mode(const char *s);

int nalar_cmd_spec_bench(int argc, char **argv);
int nalar_cmd_prefix_bench(int argc, char **argv);
int nalar_cmd_verify_bench(int argc, char **argv);

#endif
