/*
 * `nalar eval` (cli/eval.c): teacher-forced logits of token ids.
 */
#ifndef NALAR_CLI_EVAL_H
#define NALAR_CLI_EVAL_H

int nalar_cmd_eval(int argc, char **argv);

#endif
