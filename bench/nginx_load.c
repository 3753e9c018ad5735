/*
 * nginx_load: the load client of bench/nginx.sh.
 *
 *   nginx_load http    --port P [-c STREAMS] [-d SECONDS] [-n MAX_TOKENS]
 *                      [-p PROMPT_TOKENS] [--logprobs] [--interfere LEN]
 *                      [--shared N] [--path /v1] [-r REQUESTS]
 *                      [--itl-out FILE] [--peer]
 *   nginx_load engine  -m MODEL [-t THREADS] [--batch-tokens N]
 *                      [--backend cpu|cuda] [--kv BYTES]
 *                      [--kv-dtype f32|bf16] (same load)
 *   nginx_load idle    --port P --pid WORKER [-c 2000] [--step 250]
 *   nginx_load predict --port P [-c STREAMS] [-d SECONDS] [-n MAX_TOKENS]
 *                      [--alter PCT] [--reps R] [--path /v1]
 *                      [--pred-path /auto/v1]
 *
 * http: STREAMS connections to 127.0.0.1 (HTTP/1.1 keep-alive, epoll), each
 * sending streaming greedy completions (POST /v1/completions, "stream":
 * true, ignore_eos, max_tokens fixed) back to back for SECONDS.  Per
 * request: TTFT = request written -> first `data:` event with a token;
 * inter-token latency = gap between successive token events / tokens in the
 * event (counted exactly with --logprobs: each token comes back as
 * "token_id:N"; otherwise not reported); ms/token = (last token - request
 * written) / completion_tokens (from the usage chunk).  --interfere LEN adds
 * one connection sending LEN-token prompts (max_tokens 1) over and over:
 * the long prefills the running streams must share steps with.
 *
 * --peer: the server is llama.cpp's llama-server (its /v1/completions
 * takes the same token-id prompts, ignore_eos and include_usage, and sends
 * one event per sampled token, none for a token whose text is held back,
 * e.g. an incomplete UTF-8 sequence).  Its logprobs would carry ids, but
 * none for a held-back token, and cost it a sort of the vocabulary per
 * token; so --logprobs asks it instead for "timings_per_token": every
 * event then carries timings.predicted_n, the tokens decoded so far, and
 * an event's tokens are its growth (a held-back token counts with the
 * next event, as a multi-token event of Nalar's does).  The rest is
 * measured as for Nalar: TTFT at the first event with a token, ms/token
 * from the usage chunk's completion_tokens.  llama-server closes the
 * connection after a streamed response, so each request goes on a new
 * one (TTFT starts when the request is written, after the connect).
 *
 * engine: the same load on the same engine in this process, driven the way
 * the module drives it (engine thread, notify -> eventfd -> take on the
 * consumer thread), so that the difference to `http` is nginx's part.
 *
 * --shared N: the first N prompt tokens are the same in every request (a
 * shared system prompt), the rest distinct.  -r REQUESTS: the streams send
 * that many requests in all (then the run ends when they are answered,
 * SECONDS or not).  --itl-out FILE: every inter-token gap (ms, with
 * --logprobs), one per line, for plotting the distribution.  --seed S:
 * other distinct prompt tokens (the shared ones stay), so that a run does
 * not find the last run's prompts in the prefix cache.  --path: the URI prefix of
 * /completions.
 *
 * predict: each stream has one fixed prompt.  Its greedy answer is fetched
 * first (from --path, with logprobs for the tokens' text offsets), and the
 * prediction is that answer with one token in 100/PCT replaced by another
 * token's text (ASCII spans only).  Then R times: SECONDS of plain streams
 * on --path, SECONDS of the same requests with the prediction on
 * --pred-path; a JSON line per phase (with the accepted and rejected
 * prediction tokens the usage reported) and a summary line with the median
 * of the paired tok/s ratios.
 *
 * idle: opens STREAMS streaming requests, STEP at a time, that stay queued
 * (run nginx with nalar_max_running 1: one request runs, the rest wait;
 * a stream that ends is replaced on its connection), and after each step
 * reads the worker's VmRSS and the engine's waiting/running gauges.
 *
 * One JSON line on stdout.  Prompts are token ids (no tokenizer in the
 * path), distinct per request so that no cache helps.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "model.h"
#include "clock.h"
#include "load_samples.h"

#include <jansson.h>

#define MAX_PROMPT 8192


/* --- the load ------------------------------------------------------------ */

typedef struct {
    int    streams, max_tokens, prompt_tokens, logprobs, interfere, vocab;
    double seconds;
    int    shared;          /* leading prompt tokens common to all */
    int    fixed;           /* 1: one prompt per stream, not per request */
    const char *path;       /* URI prefix of /completions */
    int    total;           /* requests in all (0: until SECONDS) */
    const char *itl_out;    /* file for every inter-token gap, or NULL */
    int    seed;            /* varies the distinct prompt tokens by run */
    int    peer;            /* 1: the server is llama-server (--peer) */
} load_opts;

typedef struct {
    vec    ttft, itl, per_token, ittft;   /* ms; ittft: the interferer's */
    long   requests, tokens, chunks, errors, irequests;
    long   accepted, rejected;          /* prediction tokens (usage) */
    double t0, t1;
} load_stats;

static void stats_free(load_stats *st);

enum { ROLE_STREAM, ROLE_INTERFERE, ROLE_IDLE };

/* One request in flight: when it was sent and what came back so far. */
typedef struct {
    double t_sent, t_first, t_prev;
    int    tokens, usage_tokens, done, accepted, rejected;
} req_timing;


/* Distinct prompt per (stream, request): BOS then pseudo-random ids above
 * the control tokens (0..2); the first `shared` ids come from one seed
 * common to every prompt. */
static int
make_prompt(int32_t *ids, int n, uint64_t seed, int vocab, int shared)
{
    uint64_t x = 0x5DEECE66Dull, y = seed * 0x9E3779B97F4A7C15ull + 1;

    ids[0] = 1;
    for (int i = 1; i < n; i++) {
        uint64_t *z = i < shared ? &x : &y;

        *z ^= *z << 13; *z ^= *z >> 7; *z ^= *z << 17;
        ids[i] = 3 + (int32_t) (*z % (uint64_t) (vocab - 3));
    }
    return n;
}


/* The prompt seed of a stream's next request. */
static uint64_t
prompt_seed(const load_opts *o, int id, int nreq)
{
    return (uint64_t) id * 1000003u + (o->fixed ? 0 : (uint64_t) nreq)
           + (uint64_t) o->seed * 0x100000001ull;
}


/* A run of tokens arrived at t: TTFT for the first, else one inter-token
 * gap per token (the event's gap shared by its tokens). */
static void
on_tokens(load_stats *st, req_timing *q, int role, int k, double t)
{
    if (k <= 0) {
        return;
    }
    if (q->tokens == 0) {
        q->t_first = t;
        vec_push(role == ROLE_INTERFERE ? &st->ittft : &st->ttft,
                 1e3 * (t - q->t_sent));
    } else if (role == ROLE_STREAM && k > 0) {
        for (int i = 0; i < k; i++) {
            vec_push(&st->itl, 1e3 * (t - q->t_prev) / k);
        }
    }
    q->t_prev = t;
    q->tokens += k;
    if (role == ROLE_STREAM) {
        st->chunks++;
    }
}


static void
on_finish(load_stats *st, req_timing *q, int role)
{
    int n = q->usage_tokens > 0 ? q->usage_tokens : q->tokens;

    if (role == ROLE_INTERFERE) {
        st->irequests++;
        return;
    }
    st->requests++;
    st->tokens += n;
    st->accepted += q->accepted;
    st->rejected += q->rejected;
    if (n > 0) {
        vec_push(&st->per_token, 1e3 * (q->t_prev - q->t_sent) / n);
    }
}


static void
print_ms(const char *name, vec *s)
{
    printf(", \"%s\": {\"p50\": %.4f, \"p99\": %.4f, \"n\": %zu}", name,
           pct(s, 0.50), pct(s, 0.99), s->n);
}


static void
print_stats(const char *mode, const load_opts *o, load_stats *st)
{
    double dt = st->t1 - st->t0;

    printf("{\"mode\": \"%s\", \"streams\": %d, \"max_tokens\": %d, "
           "\"prompt_tokens\": %d, \"interfere\": %d, \"seconds\": %.3f, "
           "\"requests\": %ld, \"errors\": %ld, \"tokens\": %ld, "
           "\"tokens_per_s\": %.1f, \"tokens_per_event\": %.3f, "
           "\"shared\": %d, \"path\": \"%s\", \"accepted_prediction\": "
           "%ld, \"rejected_prediction\": %ld, \"counted_by\": \"%s\"",
           mode, o->streams, o->max_tokens, o->prompt_tokens, o->interfere,
           dt, st->requests, st->errors, st->tokens,
           dt > 0 ? (double) st->tokens / dt : 0,
           st->chunks ? (double) st->tokens / (double) st->chunks : 0,
           o->shared, o->path, st->accepted, st->rejected,
           !o->logprobs ? "text" : o->peer ? "predicted_n" : "token_id");
    print_ms("ttft_ms", &st->ttft);
    if (o->logprobs) {
        print_ms("itl_ms", &st->itl);
    }
    print_ms("ms_per_token", &st->per_token);
    if (o->itl_out != NULL) {
        FILE *f = fopen(o->itl_out, "w");

        if (f == NULL) {
            die("cannot write --itl-out");
        }
        for (size_t i = 0; i < st->itl.n; i++) {
            fprintf(f, "%.3f\n", st->itl.v[i]);
        }
        fclose(f);
    }
    if (o->interfere) {
        print_ms("interfere_ttft_ms", &st->ittft);
        printf(", \"interfere_requests\": %ld", st->irequests);
    }
    printf("}\n");
    fflush(stdout);
}


/* --- HTTP/1.1 client ----------------------------------------------------- */

enum { S_CONNECT, S_SEND, S_HEAD, S_BODY, S_CLOSED };
enum { CH_SIZE, CH_DATA, CH_CRLF, CH_TRAILER };

typedef struct {
    int        fd, role, state, id, nreq;
    char      *out;                     /* (out_len) the request */
    size_t     out_len, out_off;
    char      *in;                      /* (in_len) raw bytes not parsed */
    size_t     in_len, in_cap;
    char      *sse;                     /* (sse_len) de-chunked body */
    size_t     sse_len, sse_cap;
    int        ch_state;
    long       ch_left;
    int        got_head;                /* this request's 200 came */
    char      *pred;                    /* ",\"prediction\":{...}" or NULL */
    req_timing q;
} conn;

typedef struct {
    int        port, ep, stopping;
    load_opts  o;
    load_stats st;
    conn      *c;                       /* (n_conn) */
    int        n_conn, open, heads;
    long       restarts;
    long       started;                 /* stream requests sent */
} client;


static void
conn_request(client *cl, conn *c)
{
    int32_t ids[MAX_PROMPT];
    int     np, len = c->role == ROLE_INTERFERE ? cl->o.interfere
                                                : cl->o.prompt_tokens;
    int     max_tokens = c->role == ROLE_INTERFERE ? 1 : cl->o.max_tokens;
    size_t  cap = 512 + 12 * (size_t) len, n;
    char   *body;

    cl->started += c->role == ROLE_STREAM;
    np = make_prompt(ids, len, prompt_seed(&cl->o, c->id, c->nreq++),
                     cl->o.vocab, c->role == ROLE_INTERFERE ? 0
                                                            : cl->o.shared);
    cap += c->pred != NULL ? strlen(c->pred) : 0;
    body = xrealloc(NULL, cap);
    n = (size_t) snprintf(body, cap, "{\"prompt\":[");
    for (int i = 0; i < np; i++) {
        n += (size_t) snprintf(body + n, cap - n, "%s%d", i ? "," : "",
                               ids[i]);
    }
    n += (size_t) snprintf(body + n, cap - n,
                           "],\"max_tokens\":%d,\"temperature\":0,"
                           "\"stream\":true,\"ignore_eos\":true,"
                           "\"stream_options\":{\"include_usage\":true}%s%s}",
                           max_tokens,
                           !cl->o.logprobs ? ""
                           : cl->o.peer ? ",\"timings_per_token\":true"
                           : ",\"logprobs\":0,"
                             "\"return_tokens_as_token_ids\":true",
                           c->pred != NULL && c->role == ROLE_STREAM
                           ? c->pred : "");
    c->out = xrealloc(c->out, n + 256 + strlen(cl->o.path));
    c->out_len = (size_t) snprintf(c->out, n + 256 + strlen(cl->o.path),
                                   "POST %s/completions HTTP/1.1\r\n"
                                   "Host: 127.0.0.1\r\n"
                                   "Content-Type: application/json\r\n"
                                   "Content-Length: %zu\r\n\r\n%s",
                                   cl->o.path, n, body);
    free(body);
    c->out_off = 0;
    c->state = S_SEND;
    c->got_head = 0;
    c->ch_state = CH_SIZE;
    c->sse_len = 0;
    memset(&c->q, 0, sizeof(c->q));
}


static void
conn_watch(client *cl, conn *c, int op, uint32_t events)
{
    struct epoll_event ev;

    ev.events = events;
    ev.data.ptr = c;
    if (epoll_ctl(cl->ep, op, c->fd, &ev) != 0) {
        die("epoll_ctl failed");
    }
}


static void
conn_open(client *cl, conn *c)
{
    struct sockaddr_in a;
    int                one = 1;

    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (c->fd < 0) {
        die("socket() failed (raise ulimit -n)");
    }
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t) cl->port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c->fd, (struct sockaddr *) &a, sizeof(a)) != 0
        && errno != EINPROGRESS)
    {
        die("connect() to 127.0.0.1 failed");
    }
    conn_request(cl, c);
    c->state = S_CONNECT;
    conn_watch(cl, c, EPOLL_CTL_ADD, EPOLLIN | EPOLLOUT);
    cl->open++;
}


static void
conn_close(client *cl, conn *c)
{
    if (c->state == S_CLOSED) {
        return;
    }
    close(c->fd);
    c->state = S_CLOSED;
    cl->open--;
    if (c->got_head) {
        cl->heads--;
    }
}


static void
conn_fail(client *cl, conn *c, const char *why)
{
    fprintf(stderr, "nginx_load: connection %d: %s\n", c->id, why);
    cl->st.errors++;
    conn_close(cl, c);
}


static void
conn_send(client *cl, conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);

        if (n < 0) {
            if (errno == EAGAIN) {
                return;
            }
            conn_fail(cl, c, "write failed");
            return;
        }
        c->out_off += (size_t) n;
    }
    c->q.t_sent = nalar_now_s();
    c->state = S_HEAD;
    conn_watch(cl, c, EPOLL_CTL_MOD, EPOLLIN);
}


static int
count(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    int    c = 0;

    for (const char *p = s; (p = memmem(p, n - (size_t) (p - s), needle, k));
         p += k)
    {
        c++;
    }
    return c;
}


/* One SSE event (without its blank line) that arrived at t. */
static void
conn_event(client *cl, conn *c, const char *ev, size_t n, double t)
{
    const char *u;
    int         k;

    if (n == 0 || ev[0] == ':') {
        return;                                 /* ": keep-alive" */
    }
    if (n < 6 || memcmp(ev, "data: ", 6) != 0) {
        return;
    }
    ev += 6;
    n -= 6;
    if (n == 6 && memcmp(ev, "[DONE]", 6) == 0) {
        c->q.done = 1;
        return;
    }
    if (memmem(ev, n, "{\"error\"", 8) == ev) {
        cl->st.errors++;
        return;
    }
    u = memmem(ev, n, "\"completion_tokens\":", 20);
    if (u != NULL) {
        c->q.usage_tokens = atoi(u + 20);
    }
    u = memmem(ev, n, "\"accepted_prediction_tokens\":", 29);
    if (u != NULL) {
        c->q.accepted = atoi(u + 29);
    }
    u = memmem(ev, n, "\"rejected_prediction_tokens\":", 29);
    if (u != NULL) {
        c->q.rejected = atoi(u + 29);
    }
    if (cl->o.logprobs && cl->o.peer) {
        /* llama-server: the tokens decoded so far, less those counted */
        u = memmem(ev, n, "\"predicted_n\":", 14);
        k = u != NULL ? atoi(u + 14) - c->q.tokens : 0;
    } else if (cl->o.logprobs) {
        k = count(ev, n, "\"token_id:");
    } else {
        /* without logprobs an event says only that it carries text */
        u = memmem(ev, n, "\"text\":\"", 8);
        k = u != NULL && u[8] != '"';
    }
    if (c->role != ROLE_IDLE) {
        on_tokens(&cl->st, &c->q, c->role, k, t);
    }
}


/* The response ended: account it, then the next request or close. */
static void
conn_done(client *cl, conn *c)
{
    if (!c->q.done) {
        conn_fail(cl, c, "stream ended without [DONE]");
        return;
    }
    if (c->role == ROLE_IDLE) {
        cl->restarts++;
    } else {
        on_finish(&cl->st, &c->q, c->role);
    }
    if (c->got_head) {
        cl->heads--;
        c->got_head = 0;
    }
    if (cl->stopping
        || (c->role == ROLE_STREAM && cl->o.total > 0
            && cl->started >= cl->o.total)
        || (c->role == ROLE_STREAM && nalar_now_s() >= cl->st.t0
                                                    + cl->o.seconds))
    {
        conn_close(cl, c);
        return;
    }
    if (cl->o.peer) {
        /* llama-server: one streamed response per connection */
        conn_close(cl, c);
        c->in_len = 0;
        conn_open(cl, c);
        return;
    }
    conn_request(cl, c);
    conn_watch(cl, c, EPOLL_CTL_MOD, EPOLLIN | EPOLLOUT);
    conn_send(cl, c);
}


/* De-chunk what came in and hand out complete events; 1 at the end of the
 * response. */
static int
conn_parse_body(client *cl, conn *c, double t)
{
    size_t off = 0;
    int    end = 0;

    while (off < c->in_len && !end) {
        char  *p = c->in + off, *nl;
        size_t avail = c->in_len - off;

        switch (c->ch_state) {
        case CH_SIZE:
            nl = memmem(p, avail, "\r\n", 2);
            if (nl == NULL) {
                goto more;
            }
            c->ch_left = strtol(p, NULL, 16);
            off += (size_t) (nl - p) + 2;
            c->ch_state = c->ch_left == 0 ? CH_TRAILER : CH_DATA;
            break;
        case CH_DATA: {
            size_t k = avail < (size_t) c->ch_left ? avail
                                                   : (size_t) c->ch_left;

            if (c->sse_len + k > c->sse_cap) {
                c->sse_cap = 2 * (c->sse_len + k);
                c->sse = xrealloc(c->sse, c->sse_cap);
            }
            memcpy(c->sse + c->sse_len, p, k);
            c->sse_len += k;
            c->ch_left -= (long) k;
            off += k;
            if (c->ch_left == 0) {
                c->ch_state = CH_CRLF;
            }
            break;
        }
        case CH_CRLF:
            if (avail < 2) {
                goto more;
            }
            off += 2;
            c->ch_state = CH_SIZE;
            break;
        case CH_TRAILER:
            nl = memmem(p, avail, "\r\n", 2);
            if (nl == NULL) {
                goto more;
            }
            off += (size_t) (nl - p) + 2;
            end = nl == p;                      /* the empty line */
            break;
        }
    }
more:
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;

    /* events end with a blank line */
    {
        size_t start = 0;
        char  *e;

        while ((e = memmem(c->sse + start, c->sse_len - start, "\n\n", 2))) {
            conn_event(cl, c, c->sse + start, (size_t) (e - c->sse) - start,
                       t);
            start = (size_t) (e - c->sse) + 2;
        }
        memmove(c->sse, c->sse + start, c->sse_len - start);
        c->sse_len -= start;
    }
    return end;
}


static void
conn_read(client *cl, conn *c)
{
    for ( ;; ) {
        ssize_t n;
        double  t;

        if (c->in_cap - c->in_len < 16384) {
            c->in_cap = c->in_cap ? 2 * c->in_cap : 32768;
            c->in = xrealloc(c->in, c->in_cap);
        }
        n = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
        if (n < 0 && errno == EAGAIN) {
            return;
        }
        if (n <= 0) {
            conn_fail(cl, c, n == 0 ? "server closed the connection"
                                    : "read failed");
            return;
        }
        t = nalar_now_s();
        c->in_len += (size_t) n;

        if (c->state == S_HEAD) {
            char  *e = memmem(c->in, c->in_len, "\r\n\r\n", 4);
            size_t hl;

            if (e == NULL) {
                continue;
            }
            hl = (size_t) (e - c->in) + 4;
            if (c->in_len < 12 || memcmp(c->in + 9, "200", 3) != 0) {
                fprintf(stderr, "nginx_load: %.*s\n", (int) (e - c->in),
                        c->in);
                conn_fail(cl, c, "status is not 200");
                return;
            }
            if (memmem(c->in, hl, "chunked", 7) == NULL) {
                conn_fail(cl, c, "response is not chunked");
                return;
            }
            memmove(c->in, c->in + hl, c->in_len - hl);
            c->in_len -= hl;
            c->state = S_BODY;
            c->got_head = 1;
            cl->heads++;
        }
        if (c->state == S_BODY && conn_parse_body(cl, c, t)) {
            conn_done(cl, c);
            if (c->state != S_HEAD && c->state != S_BODY) {
                return;
            }
        }
    }
}


static void
client_poll(client *cl, int timeout_ms)
{
    struct epoll_event evs[256];
    int                n = epoll_wait(cl->ep, evs, 256, timeout_ms);

    for (int i = 0; i < n; i++) {
        conn *c = evs[i].data.ptr;

        if (c->state == S_CLOSED) {
            continue;
        }
        if (c->state == S_CONNECT) {
            int       e = 0;
            socklen_t l = sizeof(e);

            getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &l);
            if (e != 0) {
                conn_fail(cl, c, "connect failed");
                continue;
            }
            c->state = S_SEND;
        }
        if (c->state == S_SEND && (evs[i].events & EPOLLOUT)) {
            conn_send(cl, c);
        }
        if ((c->state == S_HEAD || c->state == S_BODY)
            && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        {
            conn_read(cl, c);
        }
    }
}


static void
client_init(client *cl, int port, const load_opts *o, int n_conn)
{
    memset(cl, 0, sizeof(*cl));
    cl->port = port;
    cl->o = *o;
    cl->ep = epoll_create1(0);
    cl->n_conn = n_conn;
    cl->c = calloc((size_t) n_conn, sizeof(conn));
    if (cl->ep < 0 || cl->c == NULL) {
        die("cannot set up the client");
    }
    for (int i = 0; i < n_conn; i++) {
        cl->c[i].id = i;
        cl->c[i].state = S_CLOSED;
    }
}


/* The streams (with preds[i] as stream i's prediction when preds is not
 * NULL) for o->seconds; the stats printed as `mode`. */
static int
run_http_load(int port, const load_opts *o, char **preds, const char *mode,
              double *tok_s)
{
    client cl;
    int    n = o->streams + (o->interfere > 0);
    double limit;

    client_init(&cl, port, o, n);
    cl.st.t0 = nalar_now_s();
    for (int i = 0; i < o->streams; i++) {
        cl.c[i].role = ROLE_STREAM;
        cl.c[i].pred = preds != NULL ? preds[i] : NULL;
        conn_open(&cl, &cl.c[i]);
    }
    if (o->interfere > 0) {
        cl.c[n - 1].role = ROLE_INTERFERE;
        conn_open(&cl, &cl.c[n - 1]);
    }
    limit = cl.st.t0 + o->seconds + 60;
    for ( ;; ) {
        int streams_open = 0;

        for (int i = 0; i < o->streams; i++) {
            streams_open += cl.c[i].state != S_CLOSED;
        }
        if (streams_open == 0) {
            break;
        }
        if (nalar_now_s() > limit) {
            die("http run did not finish in time");
        }
        client_poll(&cl, 100);
    }
    cl.st.t1 = nalar_now_s();
    cl.stopping = 1;
    for (int i = 0; i < n; i++) {
        conn_close(&cl, &cl.c[i]);
        free(cl.c[i].out);
        free(cl.c[i].in);
        free(cl.c[i].sse);
    }
    free(cl.c);
    close(cl.ep);
    print_stats(mode, o, &cl.st);
    if (tok_s != NULL) {
        *tok_s = cl.st.t1 > cl.st.t0
                 ? (double) cl.st.tokens / (cl.st.t1 - cl.st.t0) : 0;
    }
    stats_free(&cl.st);
    return cl.st.errors || cl.st.requests == 0 ? 1 : 0;
}


static int
run_http(int port, const load_opts *o)
{
    return run_http_load(port, o, NULL, "http", NULL);
}


/* --- predicted outputs --------------------------------------------------- */

/* POST body to path/completions over HTTP/1.0 (no chunking, the server
 * closes); the response body parsed, or NULL. */
static json_t *
post_json(int port, const char *path, const char *body)
{
    struct sockaddr_in a;
    size_t             n = 0, cap = 1 << 16, hl = strlen(body) + 256
                                                  + strlen(path);
    char              *buf = xrealloc(NULL, cap), *head = xrealloc(NULL, hl),
                      *e;
    int                fd = socket(AF_INET, SOCK_STREAM, 0);
    json_t            *j = NULL;
    json_error_t       je;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t) port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    hl = (size_t) snprintf(head, hl, "POST %s/completions HTTP/1.0\r\n"
                           "Content-Type: application/json\r\n"
                           "Content-Length: %zu\r\n\r\n%s", path,
                           strlen(body), body);
    if (fd < 0 || connect(fd, (struct sockaddr *) &a, sizeof(a)) != 0
        || write(fd, head, hl) != (ssize_t) hl)
    {
        die("cannot send the answer request");
    }
    for ( ;; ) {
        ssize_t k;

        if (cap - n < 4096) {
            cap *= 2;
            buf = xrealloc(buf, cap);
        }
        k = read(fd, buf + n, cap - n - 1);
        if (k <= 0) {
            break;
        }
        n += (size_t) k;
    }
    close(fd);
    buf[n] = '\0';
    e = strstr(buf, "\r\n\r\n");
    if (n < 12 || memcmp(buf + 9, "200", 3) != 0 || e == NULL) {
        fprintf(stderr, "nginx_load: answer request: %.200s\n", buf);
    } else {
        j = json_loads(e + 4, 0, &je);
    }
    free(buf);
    free(head);
    return j;
}


static int
ascii_span(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char) s[i] >= 0x80) {
            return 0;
        }
    }
    return n > 0;
}


/* Stream `id`'s prediction: its greedy answer with one token in every
 * `every` replaced by the text of another token; *altered counts them.
 * Returns ",\"prediction\":{...}" (malloc) or NULL. */
static char *
make_prediction(int port, const load_opts *o, int id, int every,
                int *altered, int *n_tok)
{
    int32_t     ids[MAX_PROMPT];
    size_t      cap = 512 + 12 * (size_t) o->prompt_tokens, n, len;
    char       *body = xrealloc(NULL, cap), *out, *pred, *res;
    const char *text;
    json_t     *j, *ch, *offs, *p;
    int         np, k;

    np = make_prompt(ids, o->prompt_tokens, prompt_seed(o, id, 0), o->vocab,
                     o->shared);
    n = (size_t) snprintf(body, cap, "{\"prompt\":[");
    for (int i = 0; i < np; i++) {
        n += (size_t) snprintf(body + n, cap - n, "%s%d", i ? "," : "",
                               ids[i]);
    }
    snprintf(body + n, cap - n, "],\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true,\"logprobs\":0}", o->max_tokens);
    j = post_json(port, o->path, body);
    free(body);
    ch = j != NULL ? json_array_get(json_object_get(j, "choices"), 0) : NULL;
    text = json_string_value(json_object_get(ch, "text"));
    offs = json_object_get(json_object_get(ch, "logprobs"), "text_offset");
    if (text == NULL || !json_is_array(offs)) {
        json_decref(j);
        return NULL;
    }
    len = strlen(text);
    k = (int) json_array_size(offs);
    *n_tok = k;
    *altered = 0;
    out = xrealloc(NULL, 2 * len + 3 * (size_t) k + 64);
    n = 0;
    for (int i = 0; i < k; i++) {
        size_t b = (size_t) json_integer_value(json_array_get(offs, i)),
               e = i + 1 < k
                   ? (size_t) json_integer_value(json_array_get(offs, i + 1))
                   : len;
        int    alter = every > 0 && i % every
                       == (int) ((uint64_t) (i / every) * 2654435761u
                                 % (uint64_t) every);

        if (b > len || e > len || e < b) {
            break;
        }
        if (alter && ascii_span(text + b, e - b)) {
            /* the next token whose text is ASCII and different, or else
             * (an answer of one repeated token) a word of its own */
            size_t rb = 0, re = 0;

            for (int t = 1; t < k && re == 0; t++) {
                int r = (i + t * 7) % k;

                rb = (size_t) json_integer_value(json_array_get(offs, r));
                re = r + 1 < k ? (size_t) json_integer_value(
                                     json_array_get(offs, r + 1))
                               : len;
                if (rb > re || re > len || !ascii_span(text + rb, re - rb)
                    || (re - rb == e - b
                        && memcmp(text + rb, text + b, e - b) == 0))
                {
                    re = 0;
                }
            }
            (*altered)++;
            if (re == 0) {
                memcpy(out + n, e - b == 3 && memcmp(text + b, " zq", 3) == 0
                                ? " qz" : " zq", 3);
                n += 3;
                continue;
            }
            b = rb;
            e = re;
        }
        memcpy(out + n, text + b, e - b);
        n += e - b;
    }
    out[n] = '\0';
    p = json_pack("{s:s,s:s}", "type", "content", "content", out);
    pred = p != NULL ? json_dumps(p, JSON_COMPACT) : NULL;
    res = NULL;
    if (pred != NULL) {
        res = xrealloc(NULL, strlen(pred) + 16);
        snprintf(res, strlen(pred) + 16, ",\"prediction\":%s", pred);
    }
    free(pred);
    json_decref(p);
    free(out);
    json_decref(j);
    return res;
}


static int
run_predict(int port, const load_opts *o_in, const char *pred_path,
            int alter_pct, int reps)
{
    load_opts  o = *o_in, op;
    char     **preds = calloc((size_t) o.streams, sizeof(char *));
    double    *ratio = calloc((size_t) reps, sizeof(double)), a, b;
    int        rc = 0, altered = 0, total = 0, every;

    if (preds == NULL || ratio == NULL) {
        die("out of memory");
    }
    o.fixed = 1;
    every = alter_pct > 0 ? 100 / alter_pct : 0;
    for (int i = 0; i < o.streams; i++) {
        int alt = 0, nt = 0;

        preds[i] = make_prediction(port, &o, i, every, &alt, &nt);
        if (preds[i] == NULL) {
            die("could not fetch a greedy answer for a prediction");
        }
        altered += alt;
        total += nt;
    }
    op = o;
    op.path = pred_path;
    for (int r = 0; r < reps; r++) {
        rc |= run_http_load(port, &o, NULL, "plain", &a);
        rc |= run_http_load(port, &op, preds, "predicted", &b);
        ratio[r] = a > 0 ? b / a : 0;
    }
    qsort(ratio, (size_t) reps, sizeof(double), cmp_double);
    printf("{\"mode\": \"predict_summary\", \"streams\": %d, "
           "\"answer_tokens\": %d, \"altered_tokens\": %d, \"reps\": %d, "
           "\"speedup_median\": %.3f, \"speedup_min\": %.3f, "
           "\"speedup_max\": %.3f}\n", o.streams, total, altered, reps,
           ratio[reps / 2], ratio[0], ratio[reps - 1]);
    for (int i = 0; i < o.streams; i++) {
        free(preds[i]);
    }
    free(preds);
    free(ratio);
    return rc;
}


/* --- idle streams -------------------------------------------------------- */

static long
rss_kb(int pid)
{
    char  path[64], line[256];
    long  kb = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kb = atol(line + 6);
        }
    }
    fclose(f);
    return kb;
}


/* GET /metrics on its own connection: the sum of a gauge over models. */
static void
gauges(int port, long *waiting, long *running)
{
    struct sockaddr_in a;
    static char        buf[1 << 20];
    size_t             n = 0;
    int                fd = socket(AF_INET, SOCK_STREAM, 0);
    const char        *req = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                             "Connection: close\r\n\r\n";
    struct pollfd      p;

    *waiting = *running = -1;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t) port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *) &a, sizeof(a)) != 0
        || write(fd, req, strlen(req)) != (ssize_t) strlen(req))
    {
        if (fd >= 0) {
            close(fd);
        }
        return;
    }
    p.fd = fd;
    p.events = POLLIN;
    while (n < sizeof(buf) - 1 && poll(&p, 1, 5000) == 1) {
        ssize_t k = read(fd, buf + n, sizeof(buf) - 1 - n);

        if (k <= 0) {
            break;
        }
        n += (size_t) k;
    }
    close(fd);
    buf[n] = '\0';
    *waiting = *running = 0;
    for (char *l = strtok(buf, "\n"); l != NULL; l = strtok(NULL, "\n")) {
        char *sp = strrchr(l, ' ');

        if (sp == NULL) {
            continue;
        }
        if (strncmp(l, "nalar_requests_waiting", 22) == 0) {
            *waiting += atol(sp + 1);
        } else if (strncmp(l, "nalar_requests_running", 22) == 0) {
            *running += atol(sp + 1);
        }
    }
}


/* Poll until every open stream has its 200 (or timeout), then settle. */
static void
idle_settle(client *cl, double timeout)
{
    double end = nalar_now_s() + timeout, quiet;

    while (cl->heads < cl->open && nalar_now_s() < end) {
        client_poll(cl, 20);
    }
    quiet = nalar_now_s() + 0.5;
    while (nalar_now_s() < quiet) {
        client_poll(cl, 20);
    }
}


static int
run_idle(int port, int pid, const load_opts *o, int step)
{
    client cl;
    long   rss0, w, r;
    int    opened = 0, first = 1;

    client_init(&cl, port, o, o->streams);
    cl.st.t0 = nalar_now_s();
    idle_settle(&cl, 0);
    rss0 = rss_kb(pid);
    if (rss0 < 0) {
        die("cannot read the worker's /proc/PID/status");
    }
    printf("{\"mode\": \"idle\", \"max_tokens\": %d, \"prompt_tokens\": %d, "
           "\"rss0_kb\": %ld, \"levels\": [", o->max_tokens,
           o->prompt_tokens, rss0);
    while (opened < o->streams) {
        int k = opened + step < o->streams ? step : o->streams - opened;

        for (int i = opened; i < opened + k; i++) {
            cl.c[i].role = ROLE_IDLE;
            conn_open(&cl, &cl.c[i]);
        }
        opened += k;
        idle_settle(&cl, 20);
        gauges(port, &w, &r);
        printf("%s{\"streams\": %d, \"open\": %d, \"answered\": %d, "
               "\"waiting\": %ld, \"running\": %ld, \"rss_kb\": %ld}",
               first ? "" : ", ", opened, cl.open, cl.heads, w, r,
               rss_kb(pid));
        fflush(stdout);
        first = 0;
    }
    cl.stopping = 1;
    for (int i = 0; i < cl.n_conn; i++) {
        conn_close(&cl, &cl.c[i]);
    }
    /* the hang-ups cancel the queued requests; give the worker a moment */
    {
        double end = nalar_now_s() + 10;

        do {
            usleep(200000);
            gauges(port, &w, &r);
        } while ((w > 0 || r > 0) && nalar_now_s() < end);
    }
    printf("], \"restarts\": %ld, \"errors\": %ld, \"after_close\": "
           "{\"waiting\": %ld, \"running\": %ld, \"rss_kb\": %ld}}\n",
           cl.restarts, cl.st.errors, w, r, rss_kb(pid));
    return cl.st.errors ? 1 : 0;
}


/* --- the same load in-process -------------------------------------------- */

typedef struct {
    nalar_request *r;
    int            role, id, nreq, active;
    int            pending;             /* set by notify (engine thread) */
    int            efd;
    req_timing     q;
} slot;


/* Set by the engine thread with the first news since the consumer last
 * woke; the consumer clears it before it scans the slots. */
static int wake_armed;

/* Engine thread: flag the slot, wake the consumer once per batch of news
 * (as the module does: only the first insert into its empty queue writes
 * the eventfd). */
static void
slot_notify(nalar_request *r, void *ctx)
{
    slot    *s = ctx;
    uint64_t one = 1;

    (void) r;
    __atomic_store_n(&s->pending, 1, __ATOMIC_RELEASE);
    if (__atomic_exchange_n(&wake_armed, 1, __ATOMIC_ACQ_REL) == 0
        && write(s->efd, &one, sizeof(one)) < 0)
    {
        /* the counter cannot overflow here; nothing to do */
    }
}


static void
slot_submit(nalar_engine *e, slot *s, const load_opts *o)
{
    int32_t              ids[MAX_PROMPT];
    nalar_request_params p;
    nalar_err            err;
    int                  len = s->role == ROLE_INTERFERE ? o->interfere
                                                         : o->prompt_tokens;

    memset(&p, 0, sizeof(p));
    nalar_sampling_default(&p.sampling);
    p.sampling.temperature = 0;
    p.n_prompt = make_prompt(ids, len, prompt_seed(o, s->id, s->nreq++),
                             o->vocab, s->role == ROLE_INTERFERE ? 0
                                                                 : o->shared);
    p.prompt = ids;
    p.max_tokens = s->role == ROLE_INTERFERE ? 1 : o->max_tokens;
    p.ignore_eos = 1;
    p.logprobs = o->logprobs;
    memset(&s->q, 0, sizeof(s->q));
    s->r = nalar_request_create(&p, slot_notify, s, &err);
    if (s->r == NULL) {
        die(err.msg);
    }
    s->q.t_sent = nalar_now_s();
    if (nalar_engine_submit(e, s->r, &err) != 0) {
        die(err.msg);
    }
    s->active = 1;
}


/* Submit on every slot, then consume like the module: wait on the eventfd,
 * take from the flagged slots, resubmit until the time is up. */
static void
engine_drive(nalar_engine *e, slot *s, int n, const load_opts *o,
             load_stats *st)
{
    int efd = s[0].efd;

    memset(st, 0, sizeof(*st));
    st->t0 = nalar_now_s();
    for (int i = 0; i < n; i++) {
        slot_submit(e, &s[i], o);
    }
    for ( ;; ) {
        struct pollfd p = { efd, POLLIN, 0 };
        uint64_t      v;
        int           streams_active = 0;
        double        t;

        for (int i = 0; i < o->streams; i++) {
            streams_active += s[i].active;
        }
        if (streams_active == 0) {
            break;
        }
        if (poll(&p, 1, 1000) != 1 || read(efd, &v, sizeof(v)) < 0) {
            continue;
        }
        __atomic_store_n(&wake_armed, 0, __ATOMIC_SEQ_CST);
        t = nalar_now_s();
        for (int i = 0; i < n; i++) {
            nalar_output out;
            int          fin = 0;

            if (!s[i].active
                || !__atomic_exchange_n(&s[i].pending, 0, __ATOMIC_ACQ_REL))
            {
                continue;
            }
            while (nalar_request_take(s[i].r, &out)) {
                on_tokens(st, &s[i].q, s[i].role, out.n_ids, t);
                if (out.finish != NALAR_FINISH_NONE) {
                    fin = 1;
                    s[i].q.usage_tokens = out.usage.n_completion;
                    st->errors += out.finish != NALAR_FINISH_LENGTH;
                }
                nalar_output_free(&out);
            }
            if (!fin) {
                continue;
            }
            on_finish(st, &s[i].q, s[i].role);
            nalar_request_unref(s[i].r);
            s[i].r = NULL;
            s[i].active = 0;
            if (s[i].role == ROLE_INTERFERE || nalar_now_s() < st->t0 + o->seconds) {
                slot_submit(e, &s[i], o);
            }
        }
    }
    st->t1 = nalar_now_s();
}


static void
stats_free(load_stats *st)
{
    free(st->ttft.v);
    free(st->itl.v);
    free(st->per_token.v);
    free(st->ittft.v);
}


static int
run_engine(const char *model, int threads, int batch_tokens,
           const char *backend, int64_t kv, int kv_bf16,
           const load_opts *o_in)
{
    nalar_engine_opts eo;
    nalar_engine     *e;
    nalar_err         err;
    load_opts         o = *o_in, w;
    load_stats        st;
    slot             *s;
    int               n = o.streams + (o.interfere > 0), efd;

    memset(&eo, 0, sizeof(eo));
    eo.model_path = model;
    eo.n_threads = threads;
    eo.backend = backend;
    eo.kv_bytes = kv;                       /* as the nginx config's */
    eo.kv_type = kv_bf16 ? GGML_BF16 : GGML_F32;
    eo.max_batch_tokens = batch_tokens;
    eo.max_queue = 4096;
    eo.prefix_cache = 0;
    eo.spec_mode = NALAR_SPEC_OFF;
    e = nalar_engine_create(&eo, &err);
    if (e == NULL || nalar_engine_start(e, &err) != 0) {
        die(err.msg);
    }
    o.vocab = nalar_engine_model(e)->cfg.n_vocab;
    efd = eventfd(0, EFD_CLOEXEC);
    s = calloc((size_t) n, sizeof(slot));
    if (efd < 0 || s == NULL) {
        die("cannot set up the engine run");
    }
    for (int i = 0; i < n; i++) {
        s[i].id = i;
        s[i].efd = efd;
        s[i].role = i < o.streams ? ROLE_STREAM : ROLE_INTERFERE;
    }

    /* warm-up, untimed: one request per stream touches the KV pool and
     * wakes the threads, as the warm-up run does for nginx */
    w = o;
    w.seconds = 0;
    w.interfere = 0;
    engine_drive(e, s, o.streams, &w, &st);
    stats_free(&st);

    engine_drive(e, s, n, &o, &st);
    for (int i = 0; i < n; i++) {
        if (s[i].r != NULL) {
            nalar_request_cancel(s[i].r);
        }
    }
    nalar_engine_destroy(e);                /* joins: no notify after */
    for (int i = 0; i < n; i++) {
        if (s[i].r != NULL) {
            nalar_request_unref(s[i].r);
        }
    }
    free(s);
    close(efd);
    print_stats("engine", &o, &st);
    stats_free(&st);
    return st.errors ? 1 : 0;
}


/* --- main ---------------------------------------------------------------- */

static void
usage(void)
{
    fprintf(stderr,
        "usage:\n"
        "  nginx_load http    --port P [-c STREAMS] [-d SECONDS] [-n TOKENS]"
        " [-p PROMPT]\n"
        "                     [--logprobs] [--interfere LEN] [--vocab V]"
        " [--shared N]\n"
        "                     [--path /v1] [-r REQUESTS] [--itl-out FILE]"
        " [--seed S] [--peer]\n"
        "  nginx_load engine  -m MODEL [-t THREADS] [--batch-tokens N]"
        " [--backend cpu|cuda]\n"
        "                     [--kv BYTES] [--kv-dtype f32|bf16]"
        " (load options as http)\n"
        "  nginx_load idle    --port P --pid WORKER [-c 2000] [--step 250]"
        " [-n TOKENS] [-p PROMPT]\n"
        "  nginx_load predict --port P [--alter PCT] [--reps R]"
        " [--pred-path /auto/v1]\n"
        "                     (load options as http)\n");
    exit(2);
}


int
main(int argc, char **argv)
{
    load_opts   o = { 1, 128, 16, 0, 0, 2048, 2.0, 0, 0, "/v1", 0, NULL, 0,
                      0 };
    const char *mode, *model = NULL, *backend = NULL, *pred_path = "/auto/v1";
    int         port = 0, pid = 0, step = 250, threads = 2, batch = 512,
                alter = 10, reps = 3;
    int64_t     kv = 64ll << 20;
    int         kv_bf16 = 0;

    if (argc < 2) {
        usage();
    }
    mode = argv[1];
    if (strcmp(mode, "idle") == 0) {
        o.streams = 2000;
        o.max_tokens = 480;
        o.prompt_tokens = 8;
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (strcmp(a, "--logprobs") == 0) { o.logprobs = 1; continue; }
        if (strcmp(a, "--peer") == 0) { o.peer = 1; continue; }
        if (v == NULL) {
            usage();
        }
        i++;
        if (strcmp(a, "--port") == 0) port = atoi(v);
        else if (strcmp(a, "--pid") == 0) pid = atoi(v);
        else if (strcmp(a, "-c") == 0) o.streams = atoi(v);
        else if (strcmp(a, "-d") == 0) o.seconds = atof(v);
        else if (strcmp(a, "-n") == 0) o.max_tokens = atoi(v);
        else if (strcmp(a, "-p") == 0) o.prompt_tokens = atoi(v);
        else if (strcmp(a, "--interfere") == 0) o.interfere = atoi(v);
        else if (strcmp(a, "--vocab") == 0) o.vocab = atoi(v);
        else if (strcmp(a, "--step") == 0) step = atoi(v);
        else if (strcmp(a, "-m") == 0) model = v;
        else if (strcmp(a, "-t") == 0) threads = atoi(v);
        else if (strcmp(a, "--batch-tokens") == 0) batch = atoi(v);
        else if (strcmp(a, "--shared") == 0) o.shared = atoi(v);
        else if (strcmp(a, "--path") == 0) o.path = v;
        else if (strcmp(a, "--pred-path") == 0) pred_path = v;
        else if (strcmp(a, "--alter") == 0) alter = atoi(v);
        else if (strcmp(a, "--reps") == 0) reps = atoi(v);
        else if (strcmp(a, "-r") == 0) o.total = atoi(v);
        else if (strcmp(a, "--seed") == 0) o.seed = atoi(v);
        else if (strcmp(a, "--itl-out") == 0) o.itl_out = v;
        else if (strcmp(a, "--backend") == 0) backend = v;
        else if (strcmp(a, "--kv") == 0) kv = atoll(v);
        else if (strcmp(a, "--kv-dtype") == 0) kv_bf16 = strcmp(v, "bf16") == 0;
        else usage();
    }
    if (o.streams < 1 || o.max_tokens < 1 || o.prompt_tokens < 1
        || o.prompt_tokens > MAX_PROMPT || o.interfere < 0
        || o.interfere > MAX_PROMPT || o.vocab < 4 || step < 1
        || o.shared < 0 || o.shared > o.prompt_tokens || alter < 0
        || alter > 100 || reps < 1 || kv <= 0)
    {
        usage();
    }
    if (strcmp(mode, "predict") == 0 && port > 0) {
        return run_predict(port, &o, pred_path, alter, reps);
    }
    if (strcmp(mode, "http") == 0 && port > 0) {
        return run_http(port, &o);
    }
    if (strcmp(mode, "idle") == 0 && port > 0 && pid > 0) {
        return run_idle(port, pid, &o, step);
    }
    if (strcmp(mode, "engine") == 0 && model != NULL) {
        return run_engine(model, threads, batch, backend, kv, kv_bf16, &o);
    }
    usage();
    return 2;
}
