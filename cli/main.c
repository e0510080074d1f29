/*
 * orochi — the user's CLI. Dispatches to one subcommand; see README.md for the full reference.
 * A core-only build (CMake OROCHI_CORE_ONLY) leaves out the commands that speak JSON.
 */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command;

static const command COMMANDS[] = {
    {"run", cmd_run, "generate text in-process (sequential decoding)"},
    {"eval", cmd_eval, "teacher-forced logits of a token sequence (for tests)"},
    {"inspect", cmd_inspect, "print a GGUF file's metadata and tensor table"},
#ifndef OROCHI_CORE_ONLY
    {"tokenize", cmd_tokenize, "print the token ids and pieces of a text"},
#endif
    {"mkmodel", cmd_mkmodel, "write a deterministic random-weight Llama GGUF"},
    {"quantize", cmd_quantize, "convert a GGUF model's weight matrices to another type"},
    {"mkmedusa", cmd_mkmedusa, "write deterministic random Medusa heads for a target GGUF"},
    {"hidden", cmd_hidden, "greedy generations' hidden states: Medusa training data"},
    {"train-medusa", cmd_train_medusa, "train Medusa heads for a target (self-distillation)"},
    {"bench", cmd_bench, "decode speed and batch step-time curve"},
#ifndef OROCHI_CORE_ONLY /* these speak JSON (cJSON), which the core-only build goes without */
    {"profile", cmd_profile, "ARCA: step times and acceptance, the plan a group follows"},
    {"generate", cmd_generate, "one request to a running coordinator's HTTP API"},
    {"chat", cmd_chat, "interactive chat with a running coordinator"},
#endif
};

static void usage(FILE *out)
{
    fprintf(out, "usage: orochi COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        fprintf(out, "  %-12s %s\n", COMMANDS[i].name, COMMANDS[i].help);
    fprintf(out, "\n'orochi COMMAND --help' describes a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (!strcmp(argv[1], COMMANDS[i].name))
            return COMMANDS[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "orochi: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
