
/*
 * The worker's state: one structure (ngx_nalar_module.h says who touches
 * which field, and under which lock), reached through one accessor.  It
 * is made in init_process and torn down in exit_process
 * (ngx_nalar_process.c); this file calls none of the glue's others.
 */

#include "ngx_nalar_module.h"


static ngx_http_nalar_worker_t  ngx_http_nalar_worker_state = {
    .mutex = PTHREAD_MUTEX_INITIALIZER,
    .jobs_cond = PTHREAD_COND_INITIALIZER,
    .efd = -1
};


ngx_http_nalar_worker_t *
ngx_http_nalar_worker(void)
{
    return &ngx_http_nalar_worker_state;
}
