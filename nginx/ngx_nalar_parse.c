
/*
 * The request body on its way to engine parameters: the body read into
 * one piece, and the parse threads that run api/request.c's parse
 * for bodies too large to parse on the event loop.  Jobs are queued
 * smallest first; a parsed job goes on the results queue, the parse
 * thread writes the eventfd, and the done handler (ngx_nalar_done.c)
 * hands the result to the job's `parsed` (the content handler's).
 *
 * The parse threads touch only their malloc'd job (the body's bytes, a
 * snapshot of the models), the job and result queues under the mutex and
 * the eventfd; never a request, connection or pool, and never an engine.
 * The rest runs on the event loop.
 */

#include "ngx_nalar_module.h"


/* What a parse knows of the worker's models: read on the event loop. */

void
ngx_http_nalar_snapshot(nalar_api_model *models)
{
    char                       *text;
    ngx_uint_t                  i;
    nalar_err                   err;
    nalar_model                *m;
    const nalar_tokenizer      *tok;
    ngx_http_nalar_model_t     *conf;
    ngx_http_nalar_model_rt_t  *model;
    ngx_http_nalar_worker_t    *w;

    w = ngx_http_nalar_worker();
    conf = w->rt->conf->models.elts;

    for (i = 0; i < w->rt->n_models; i++) {
        model = &w->rt->models[i];

        ngx_memzero(&models[i], sizeof(nalar_api_model));
        models[i].name = (char *) model->name.data;
        models[i].name_len = model->name.len;
        models[i].state = -2;

        if (model->engine == NULL) {
            continue;
        }

        err.msg[0] = '\0';
        models[i].state = nalar_engine_state(model->engine, &err);

        if (models[i].state < 0) {
            ngx_cpystrn((u_char *) models[i].error, (u_char *) err.msg,
                        sizeof(models[i].error));
            continue;
        }

        if (models[i].state == 0) {
            continue;
        }

        m = nalar_engine_model(model->engine);

        if (!model->style_known) {
            text = nalar_model_chat_template(m);
            model->style = nalar_chat_style_detect(text);
            tok = nalar_model_tokenizer(m);
            model->bos = nalar_tok_piece(tok, nalar_tok_bos(tok));
            model->eos = nalar_tok_piece(tok, nalar_tok_eos(tok));
            model->style_known = 1;
            free(text);
        }

        nalar_engine_limits(model->engine, &models[i].limits);
        models[i].chat_style = (int) model->style;
        models[i].tmpl = conf[i].tmpl;
        models[i].bos = model->bos;
        models[i].eos = model->eos;
    }
}


size_t
ngx_http_nalar_body_size(ngx_chain_t *cl)
{
    size_t  size;

    size = 0;

    for ( /* void */ ; cl; cl = cl->next) {
        size += (size_t) ngx_buf_size(cl->buf);
    }

    return size;
}


/* The body as one contiguous piece, from memory or the temporary file. */

ngx_int_t
ngx_http_nalar_read_body(ngx_http_request_t *r, u_char **data, size_t *len)
{
    u_char       *p;
    size_t        size;
    ssize_t       n;
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    *data = (u_char *) "";
    *len = 0;

    if (r->request_body == NULL) {
        return NGX_OK;
    }

    size = ngx_http_nalar_body_size(r->request_body->bufs);

    if (size == 0) {
        return NGX_OK;
    }

    p = ngx_pnalloc(r->pool, size);
    if (p == NULL) {
        return NGX_ERROR;
    }

    *data = p;
    *len = size;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;

        if (b->in_file) {
            n = ngx_read_file(b->file, p, (size_t) (b->file_last - b->file_pos),
                              b->file_pos);
            if (n == NGX_ERROR) {
                return NGX_ERROR;
            }

            p += n;
            continue;
        }

        /* a chunked body may end with an empty buffer (pos NULL) */

        if (b->last != b->pos) {
            p = ngx_cpymem(p, b->pos, b->last - b->pos);
        }
    }

    *len = p - *data;

    return NGX_OK;
}


/*
 * A job for the parse thread, all malloc'd: the body's bytes in memory are
 * copied here (a plain memcpy); what nginx wrote to its temporary file is
 * read on the thread, through a duplicate of the file's descriptor (the
 * request may close its own first).
 */

ngx_http_nalar_parse_t *
ngx_http_nalar_parse_job(ngx_http_request_t *r, size_t len, nalar_api_in *in,
    ngx_http_nalar_parsed_pt parsed)
{
    size_t                   at, size;
    ngx_buf_t               *b;
    ngx_uint_t               n;
    ngx_chain_t             *cl;
    ngx_http_nalar_parse_t  *job;

    n = 0;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        n++;
    }

    job = ngx_calloc(sizeof(ngx_http_nalar_parse_t)
                     + n * sizeof(ngx_http_nalar_segment_t),
                     r->connection->log);
    if (job == NULL) {
        return NULL;
    }

    job->segs = (ngx_http_nalar_segment_t *) (job + 1);
    job->in = *in;
    job->parsed = parsed;
    job->req.model = -1;

    job->models = ngx_alloc(in->n_models * sizeof(nalar_api_model),
                            r->connection->log);
    job->body = ngx_alloc(len + 1, r->connection->log);

    if (job->models == NULL || job->body == NULL) {
        ngx_http_nalar_parse_free(job);
        return NULL;
    }

    ngx_http_nalar_snapshot(job->models);
    job->in.models = job->models;

    at = 0;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;
        size = (size_t) ngx_buf_size(b);

        if (size == 0) {
            continue;
        }

        if (at + size > len) {
            break;
        }

        if (b->in_file) {
            job->segs[job->n_segs].fd = dup(b->file->fd);

            if (job->segs[job->n_segs].fd == -1) {
                ngx_log_error(NGX_LOG_ERR, r->connection->log, ngx_errno,
                              "nalar: dup() failed");
                ngx_http_nalar_parse_free(job);
                return NULL;
            }

            job->segs[job->n_segs].offset = b->file_pos;
            job->segs[job->n_segs].size = size;
            job->segs[job->n_segs].at = at;
            job->n_segs++;

        } else {
            ngx_memcpy(job->body + at, b->pos, size);
        }

        at += size;
    }

    job->len = at;

    return job;
}


/*
 * The parse thread: takes jobs in order, reads what is in files, parses,
 * and queues the result for the event loop; a job handed back is freed
 * here, so that freeing a big parse does not cost the loop either.
 */

void *
ngx_http_nalar_parse_thread(void *data)
{
    int                        prio;
    id_t                       tid;
    size_t                     max;
    ssize_t                    n;
    size_t                     got;
    uint64_t                   one;
    ngx_uint_t                 i;
    ngx_queue_t               *q;
    ngx_http_nalar_parse_t    *job;
    ngx_http_nalar_segment_t  *seg;
    ngx_http_nalar_worker_t   *w;

    w = ngx_http_nalar_worker();

    /* where the cores are short, the event loop and the engines come
     * first: a large body waits, the requests beside it do not */

    tid = (id_t) syscall(SYS_gettid);
    errno = 0;
    prio = getpriority(PRIO_PROCESS, tid);

    if (errno == 0) {
        (void) setpriority(PRIO_PROCESS, tid,
                           prio + NGX_HTTP_NALAR_PARSE_NICE);
    }

    max = (size_t) (uintptr_t) data;

    pthread_mutex_lock(&w->mutex);

    for ( ;; ) {

        /* the smallest job first; the small lane leaves larger ones */

        for ( ;; ) {
            if (__atomic_load_n(&w->parser_stop,
                                __ATOMIC_RELAXED))
            {
                goto stop;
            }

            if (!ngx_queue_empty(&w->jobs)) {
                q = ngx_queue_head(&w->jobs);
                job = ngx_queue_data(q, ngx_http_nalar_parse_t, queue);

                if (max == 0 || job->release || job->len <= max) {
                    break;
                }
            }

            pthread_cond_wait(&w->jobs_cond,
                              &w->mutex);
        }

        ngx_queue_remove(q);

        pthread_mutex_unlock(&w->mutex);

        if (job->release) {
            ngx_http_nalar_parse_free(job);
            pthread_mutex_lock(&w->mutex);
            continue;
        }

        for (i = 0; i < job->n_segs; i++) {
            seg = &job->segs[i];

            for (got = 0; got < seg->size; got += n) {
                n = pread(seg->fd, job->body + seg->at + got,
                          seg->size - got, seg->offset + got);

                if (n <= 0) {
                    if (n < 0 && errno == EINTR) {
                        n = 0;
                        continue;
                    }

                    break;
                }
            }

            if (got < seg->size) {
                job->read_failed = 1;
            }
        }

#ifdef NALAR_TEST_HOOKS
        ngx_http_nalar_test_hold(job->len);
#endif

        if (job->read_failed) {
            (void) nalar_failure_set(&job->req.err, 500, NALAR_SERVER_ERROR,
                                     NULL, "body_unreadable",
                                     "The request body could not be read");

        } else {
            (void) nalar_api_parse(job->body, job->len, &job->in, &job->req);
        }

        pthread_mutex_lock(&w->mutex);
        ngx_queue_insert_tail(&w->results, &job->queue);
        pthread_mutex_unlock(&w->mutex);

        one = 1;
        if (write(w->efd, &one, sizeof(uint64_t)) < 0) {
            /* EAGAIN: the counter is saturated, the loop is awake anyway */
        }

        pthread_mutex_lock(&w->mutex);
    }

stop:

    pthread_mutex_unlock(&w->mutex);

    return NULL;
}


/* Event loop: a job is done with; the parse thread frees it. */

void
ngx_http_nalar_parse_release(ngx_http_nalar_parse_t *job)
{
    job->ctx = NULL;
    job->release = 1;

    ngx_http_nalar_parse_post(job);
}


/*
 * Event loop: a job for the parse threads, queued smallest first (a
 * release first of all); the walk is over the jobs waiting, which the
 * requests in flight bound.
 */

void
ngx_http_nalar_parse_post(ngx_http_nalar_parse_t *job)
{
    ngx_queue_t              *q;
    ngx_http_nalar_parse_t   *prev;
    ngx_http_nalar_worker_t  *w;

    w = ngx_http_nalar_worker();

    pthread_mutex_lock(&w->mutex);

    if (job->release) {
        ngx_queue_insert_head(&w->jobs, &job->queue);

    } else {
        for (q = ngx_queue_last(&w->jobs);
             q != ngx_queue_sentinel(&w->jobs);
             q = ngx_queue_prev(q))
        {
            prev = ngx_queue_data(q, ngx_http_nalar_parse_t, queue);

            if (prev->release || prev->len <= job->len) {
                break;
            }
        }

        ngx_queue_insert_after(q, &job->queue);
    }

    pthread_cond_broadcast(&w->jobs_cond);
    pthread_mutex_unlock(&w->mutex);
}


void
ngx_http_nalar_parse_free(ngx_http_nalar_parse_t *job)
{
    ngx_uint_t  i;

    for (i = 0; i < job->n_segs; i++) {
        (void) close(job->segs[i].fd);
    }

    nalar_api_request_free(&job->req);
    ngx_free(job->models);
    ngx_free(job->body);
    ngx_free(job);
}


#ifdef NALAR_TEST_HOOKS

/*
 * nalar_test_hold_parse FILE: the parse of a body over
 * NGX_HTTP_NALAR_PARSE_SMALL waits, wherever it runs, until FILE exists,
 * and says so by making FILE.held (the module's tests only, in the test
 * build).
 */

void
ngx_http_nalar_test_hold(size_t len)
{
    int                       fd;
    char                      held[NGX_MAX_PATH + 8];
    ngx_http_nalar_worker_t  *w;

    w = ngx_http_nalar_worker();

    if (w->hold_path == NULL || len <= NGX_HTTP_NALAR_PARSE_SMALL)
    {
        return;
    }

    (void) ngx_snprintf((u_char *) held, sizeof(held), "%s.held%Z",
                        w->hold_path);

    fd = open(held, O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0644);
    if (fd != -1) {
        (void) close(fd);
    }

    while (access(w->hold_path, F_OK) != 0
           && !__atomic_load_n(&w->parser_stop,
                               __ATOMIC_RELAXED))
    {
        (void) usleep(10000);
    }
}

#endif
