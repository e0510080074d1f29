/*
 * cli/commands — the subcommands of the `orochi` CLI. Each takes the arguments after its name
 * (argv[0] is the subcommand) and returns the process exit status: 0 ok, 1 runtime failure,
 * 2 bad input (usage, malformed model file).
 */
#ifndef OROCHI_CLI_COMMANDS_H
#define OROCHI_CLI_COMMANDS_H

int cmd_run(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_mkmedusa(int argc, char **argv);
int cmd_hidden(int argc, char **argv);
int cmd_train_medusa(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
/* `orochi bench --tree-attention ...` (bench/tree_attention.c): argv[0] is "--tree-attention". */
int bench_tree_attention(int argc, char **argv);
/* `orochi bench --plans ...` (bench/plans.c): argv[0] is "--plans". */
int bench_plans(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);

#endif
