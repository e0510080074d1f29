/*
 * cli/cmd_train_medusa.c — `orochi train-medusa`: Medusa-1 heads for a target, by
 * self-distillation, in one command (docs/medusa.md, "Training").
 *
 * It drives the pipeline whose parts live elsewhere, each step a child process whose progress
 * goes to stderr as it comes:
 *   1. prompts: tools/train_medusa.py --make-prompts, documentation sentences (half continued as
 *      plain text, half as chat messages) and instruction prompts (--style instruct);
 *   2. data: `orochi hidden` (this binary) for each prompt set: the target's greedy generations
 *      with every position's final hidden state;
 *   3. training: tools/train_medusa.py (numpy; why Python: docs/medusa.md, "Why numpy") with a
 *      checkpoint after every epoch.
 * Everything goes to the work directory (--work, default OUT.work). Resumable: a step whose output
 * is already there is skipped (outputs are written under a temporary name and renamed when the
 * step succeeds, so a file that exists is whole), and training continues from its checkpoint.
 * Deterministic for a given --seed: the prompt sets are drawn with seeds seed + 2 and seed + 3,
 * the training uses seed.
 */
#include <errno.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/util.h"

extern char **environ;

#define TM_MAX_ARGS 48

typedef struct {
    const char *target, *out, *work, *python, *docs;
    long heads, prompts, instruct, tokens, epochs, seed, threads;
    char script[PATH_MAX], self[PATH_MAX], workbuf[PATH_MAX];
} tm_opts;

static void tm_usage(FILE *f)
{
    fprintf(
        f, "usage: orochi train-medusa --target M.gguf --out HEADS.gguf [--heads 4]\n"
           "                           [--prompts 500] [--instruct 600] [--tokens 128]\n"
           "                           [--epochs 3] [--seed 1] [--threads T] [--work DIR]\n"
           "                           [--docs /usr/share/doc] [--python PY]\n"
           "  Trains Medusa-1 heads for the target by self-distillation: --prompts documentation\n"
           "  sentences continued as plain text and as many as chat messages, --instruct\n"
           "  instruction prompts (chat), --tokens greedy tokens each with their hidden states\n"
           "  (`orochi hidden`), then tools/train_medusa.py for --epochs (progress with loss and\n"
           "  per-head top-1 on a held-out split). Work files go to --work (default OUT.work);\n"
           "  running it again resumes: finished steps are skipped, training continues from its\n"
           "  checkpoint. The default model takes about 15 minutes on 2 cores (docs/medusa.md).\n");
}

static bool tm_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && st.st_size > 0;
}

/* Run argv (argv[0] looked up in PATH when it has no slash) and wait; 0 when it exited 0. */
static int tm_run(char *const *argv)
{
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ), status = 0;
    if (rc) {
        fprintf(stderr, "orochi train-medusa: cannot start %s: %s\n", argv[0], strerror(rc));
        return -1;
    }
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    fprintf(stderr, "orochi train-medusa: %s failed (%s %d)\n", argv[0],
            WIFEXITED(status) ? "exit status" : "signal",
            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    return -1;
}

/* Run a step that writes `out`: skipped when out exists; else argv writes out.part (the caller
 * put that name in argv), renamed to out on success. */
static int tm_step(int n, const char *what, const char *out, char *const *argv)
{
    if (tm_exists(out)) {
        fprintf(stderr, "orochi train-medusa: step %d/6 %s: %s is there, skipped\n", n, what, out);
        return 0;
    }
    fprintf(stderr, "orochi train-medusa: step %d/6 %s -> %s\n", n, what, out);
    char part[PATH_MAX + 8];
    snprintf(part, sizeof part, "%s.part", out);
    if (tm_run(argv))
        return -1;
    if (rename(part, out)) {
        fprintf(stderr, "orochi train-medusa: cannot rename %s: %s\n", part, strerror(errno));
        return -1;
    }
    return 0;
}

/* tools/train_medusa.py: under $OROCHI_SOURCE, else beside the build (BIN/../../tools), else ./ */
static int tm_find_script(tm_opts *o)
{
    const char *src = getenv("OROCHI_SOURCE");
    char dir[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", o->self, sizeof o->self - 1);
    if (n <= 0) {
        fprintf(stderr, "orochi train-medusa: cannot find this executable's path\n");
        return -1;
    }
    o->self[n] = 0;
    const char *cands[3] = {NULL, NULL, "tools/train_medusa.py"};
    char c0[PATH_MAX + 32], c1[PATH_MAX + 32];
    if (src) {
        snprintf(c0, sizeof c0, "%s/tools/train_medusa.py", src);
        cands[0] = c0;
    }
    snprintf(dir, sizeof dir, "%s", o->self);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = 0;
        snprintf(c1, sizeof c1, "%s/../../tools/train_medusa.py", dir);
        cands[1] = c1;
    }
    for (int i = 0; i < 3; i++)
        if (cands[i] && access(cands[i], R_OK) == 0) {
            snprintf(o->script, sizeof o->script, "%s", cands[i]);
            return 0;
        }
    fprintf(stderr, "orochi train-medusa: tools/train_medusa.py not found (set OROCHI_SOURCE to "
                    "the source tree)\n");
    return -1;
}

static int tm_parse(tm_opts *o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            tm_usage(stdout);
            exit(0);
        }
        if (!(v = cli_value("train-medusa", argc, argv, &i)))
            return -1;
        struct {
            const char *name;
            long *dst, lo, hi;
        } ints[] = {{"--heads", &o->heads, 1, 64},           {"--prompts", &o->prompts, 1, 100000},
                    {"--instruct", &o->instruct, 0, 100000}, {"--tokens", &o->tokens, 2, 4096},
                    {"--epochs", &o->epochs, 1, 1000},       {"--seed", &o->seed, 0, 1000000},
                    {"--threads", &o->threads, 1, 256}};
        bool done = false;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !done; k++)
            if (!strcmp(a, ints[k].name)) {
                if (!cli_int("train-medusa", a, v, ints[k].lo, ints[k].hi, ints[k].dst))
                    return -1;
                done = true;
            }
        if (done)
            continue;
        if (!strcmp(a, "--target"))
            o->target = v;
        else if (!strcmp(a, "--out"))
            o->out = v;
        else if (!strcmp(a, "--work"))
            o->work = v;
        else if (!strcmp(a, "--python"))
            o->python = v;
        else if (!strcmp(a, "--docs"))
            o->docs = v;
        else {
            fprintf(stderr, "orochi train-medusa: unknown option '%s'\n", a);
            tm_usage(stderr);
            return -1;
        }
    }
    if (!o->target || !o->out) {
        fprintf(stderr, "orochi train-medusa: --target and --out are required\n");
        return -1;
    }
    if (access(o->target, R_OK)) {
        fprintf(stderr, "orochi train-medusa: cannot read the target %s\n", o->target);
        return -1;
    }
    if (!o->work) {
        snprintf(o->workbuf, sizeof o->workbuf, "%s.work", o->out);
        o->work = o->workbuf;
    }
    return 0;
}

int cmd_train_medusa(int argc, char **argv)
{
    static tm_opts o;
    memset(&o, 0, sizeof o);
    o.heads = 4;
    o.prompts = 500;
    o.instruct = 600;
    o.tokens = 128;
    o.epochs = 3;
    o.seed = 1;
    o.threads = cli_online_cores();
    o.docs = "/usr/share/doc";
    o.python = access("/usr/bin/python3", X_OK) ? "python3" : "/usr/bin/python3";
    if (tm_parse(&o, argc, argv) || tm_find_script(&o))
        return 2;
    if (mkdir(o.work, 0755) && errno != EEXIST) {
        fprintf(stderr, "orochi train-medusa: cannot make %s: %s\n", o.work, strerror(errno));
        return 2;
    }
    double t0 = cli_now();
    char p_all[PATH_MAX], p_plain[PATH_MAX], p_chat[PATH_MAX], p_instr[PATH_MAX],
        part[PATH_MAX + 8];
    char d_plain[PATH_MAX], d_chat[PATH_MAX], d_instr[PATH_MAX], ckpt[PATH_MAX];
    char count[32], seed_docs[32], seed_instr[32], n_instr[32], toks[32], thr[32], heads[32],
        epochs[32], seed[32];
    snprintf(p_all, sizeof p_all, "%s/prompts.txt", o.work);
    snprintf(p_plain, sizeof p_plain, "%s/plain.txt", o.work);
    snprintf(p_chat, sizeof p_chat, "%s/chat.txt", o.work);
    snprintf(p_instr, sizeof p_instr, "%s/instr.txt", o.work);
    snprintf(d_plain, sizeof d_plain, "%s/plain.bin", o.work);
    snprintf(d_chat, sizeof d_chat, "%s/chat.bin", o.work);
    snprintf(d_instr, sizeof d_instr, "%s/instr.bin", o.work);
    snprintf(ckpt, sizeof ckpt, "%s/heads.ckpt.npz", o.work);
    snprintf(count, sizeof count, "%ld", 2 * o.prompts);
    snprintf(seed_docs, sizeof seed_docs, "%ld", o.seed + 2);
    snprintf(seed_instr, sizeof seed_instr, "%ld", o.seed + 3);
    snprintf(n_instr, sizeof n_instr, "%ld", o.instruct);
    snprintf(toks, sizeof toks, "%ld", o.tokens);
    snprintf(thr, sizeof thr, "%ld", o.threads);
    snprintf(heads, sizeof heads, "%ld", o.heads);
    snprintf(epochs, sizeof epochs, "%ld", o.epochs);
    snprintf(seed, sizeof seed, "%ld", o.seed);

    /* 1. documentation prompts, split into the plain and the chat halves */
    snprintf(part, sizeof part, "%s.part", p_all);
    char *mk_docs[] = {
        (char *)o.python, o.script,  "--make-prompts", part,           "--count", count,
        "--seed",         seed_docs, "--docs",         (char *)o.docs, NULL};
    if (tm_step(1, "documentation prompts", p_all, mk_docs))
        return 1;
    if (!tm_exists(p_plain) || !tm_exists(p_chat)) {
        FILE *in = fopen(p_all, "r"), *fp = fopen(p_plain, "w"), *fc = fopen(p_chat, "w");
        char line[8192];
        long n = 0;
        while (in && fp && fc && fgets(line, sizeof line, in))
            fputs(line, n++ < o.prompts ? fp : fc);
        bool ok = in && fp && fc;
        if (in)
            fclose(in);
        if ((fp && fclose(fp)) || (fc && fclose(fc)) || !ok) {
            fprintf(stderr, "orochi train-medusa: cannot split %s\n", p_all);
            return 1;
        }
    }
    /* 2. instruction prompts */
    snprintf(part, sizeof part, "%s.part", p_instr);
    char *mk_instr[] = {
        (char *)o.python, o.script,  "--make-prompts", part,     "--count",      n_instr, "--seed",
        seed_instr,       "--style", "instruct",       "--docs", (char *)o.docs, NULL};
    if (o.instruct > 0 && tm_step(2, "instruction prompts", p_instr, mk_instr))
        return 1;
    /* 3-5. the target's generations and hidden states */
    const char *sets[3][3] = {
        {p_plain, d_plain, NULL}, {p_chat, d_chat, "--chat"}, {p_instr, d_instr, "--chat"}};
    const char *names[3] = {"data: plain continuations", "data: chat answers",
                            "data: instruction answers"};
    for (int s = 0; s < 3; s++) {
        if (s == 2 && o.instruct == 0)
            break;
        snprintf(part, sizeof part, "%s.part", sets[s][1]);
        char *hid[] = {o.self,
                       "hidden",
                       "--model",
                       (char *)o.target,
                       "--prompts",
                       (char *)sets[s][0],
                       "-n",
                       toks,
                       "--threads",
                       thr,
                       "--out",
                       part,
                       (char *)sets[s][2],
                       NULL};
        if (tm_step(3 + s, names[s], sets[s][1], hid))
            return 1;
    }
    /* 6. training (resumes from its checkpoint) */
    fprintf(stderr, "orochi train-medusa: step 6/6 training %s heads for %s epochs -> %s\n", heads,
            epochs, o.out);
    char *train[TM_MAX_ARGS] = {(char *)o.python, o.script, "--target", (char *)o.target,
                                "--data",         d_plain,  "--data",   d_chat};
    int k = 8;
    if (o.instruct > 0) {
        train[k++] = "--data";
        train[k++] = d_instr;
    }
    char *rest[] = {"--out", (char *)o.out, "--heads", heads,          "--epochs",
                    epochs,  "--seed",      seed,      "--checkpoint", ckpt};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
        train[k++] = rest[i];
    if (tm_exists(ckpt)) {
        train[k++] = "--resume";
        train[k++] = ckpt;
    }
    train[k] = NULL;
    if (tm_run(train))
        return 1;
    fprintf(stderr, "orochi train-medusa: wrote %s in %.0f s (work files in %s)\n", o.out,
            cli_now() - t0, o.work);
    return 0;
}
