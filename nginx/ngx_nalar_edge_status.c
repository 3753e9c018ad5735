
/*
 * The edge's own status: its counters in shared memory (nalar_edge_zone),
 * their Prometheus text (nalar_edge_metrics) and its readiness
 * (nalar_edge_health).  An edge has no model, so nalar_metrics and
 * /health, which describe the engines of the nginx they run in, have
 * nothing to say there.
 *
 * Counting.  A log phase handler counts each request of a location in
 * nalar_edge_zone once, when it ends: the status class the edge sent, the
 * route key it worked out (with or without prompt text), how
 * $nalar_edge_identity came out, and every try of a node as
 * $upstream_addr and $upstream_status record it (r->upstream_states):
 * the node's status class, or no answer at all (refused, reset, timed
 * out), the tries beyond a request's first, and the requests for which
 * nginx had no node left to try ("no live upstreams", which
 * $upstream_addr names by the upstream's name: not a node, not a try).
 * The counters live in one shared memory zone, so every worker adds to
 * the same ones and a reload keeps them (the zone's size never changes).
 * A request is counted when nginx frees it, which can be a moment after
 * its client has the whole answer (a lingering close).
 *
 * The nodes' table: NGX_HTTP_NALAR_EDGE_NODES slots, each an address and
 * its counters.  Invariant: a slot below `n_nodes` is filled and never
 * changes again but for its counters; slots are filled in order, under the
 * zone's mutex, and `n_nodes` is raised after the slot is written (a
 * memory barrier between), so a reader that loads `n_nodes` reads whole
 * slots without the lock.  Counters are atomic adds.  A node past the
 * table's end is counted in `nodes_dropped` only.
 *
 * Health.  nginx has no active health checks; what the edge knows of its
 * nodes is what its own tries taught it, which nginx keeps per server of
 * the upstream block (fails, checked, max_fails, fail_timeout, down) and
 * uses to choose one.  nalar_edge_health reads exactly that state, with
 * the round-robin peer list's locks (shared by the workers when the
 * upstream block has a `zone`), so it says 200 while nginx would still
 * send a request to some node and 503 when it would send none.  It reads
 * memory only: no probe, nothing that waits.
 *
 * Event loop (and configuration) only; no engine is involved.
 */

#include "ngx_nalar_module.h"


#define NGX_HTTP_NALAR_EDGE_NODES     64
#define NGX_HTTP_NALAR_EDGE_ADDR      128     /* bytes of a node's label */
#define NGX_HTTP_NALAR_EDGE_ZONE_SIZE (256 * 1024)

/* a try's outcome: the node's status class, or why there was none */
#define NGX_HTTP_NALAR_TRY_1XX        0
#define NGX_HTTP_NALAR_TRY_5XX        4
#define NGX_HTTP_NALAR_TRY_ERROR      5       /* refused, reset, no node */
#define NGX_HTTP_NALAR_TRY_TIMEOUT    6
#define NGX_HTTP_NALAR_TRY_ABORTED    7       /* the request ended first */
#define NGX_HTTP_NALAR_TRY_N          8


typedef struct {
    u_char                     addr[NGX_HTTP_NALAR_EDGE_ADDR];
    size_t                     len;
    ngx_atomic_t               tries[NGX_HTTP_NALAR_TRY_N];
} ngx_http_nalar_edge_node_t;


typedef struct {
    ngx_atomic_t               requests[5];     /* 1xx .. 5xx sent */
    ngx_atomic_t               route_keys[2];   /* without, with text */
    ngx_atomic_t               sign[6];         /* NGX_HTTP_NALAR_SIGN_* */
    ngx_atomic_t               retries;
    ngx_atomic_t               no_live;         /* nginx had no node */
    ngx_atomic_t               nodes_dropped;
    ngx_atomic_t               n_nodes;         /* see the invariant */
    ngx_http_nalar_edge_node_t nodes[NGX_HTTP_NALAR_EDGE_NODES];
} ngx_http_nalar_edge_stats_t;


static ngx_shm_zone_t *ngx_http_nalar_edge_zone_add(ngx_conf_t *cf,
    ngx_str_t *name);
static ngx_int_t ngx_http_nalar_edge_init_zone(ngx_shm_zone_t *shm_zone,
    void *data);
static ngx_int_t ngx_http_nalar_edge_log(ngx_http_request_t *r);
static ngx_http_nalar_edge_node_t *ngx_http_nalar_edge_node(
    ngx_shm_zone_t *zone, ngx_str_t *addr);
static ngx_int_t ngx_http_nalar_edge_metrics_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_nalar_edge_health_handler(ngx_http_request_t *r);
static u_char *ngx_http_nalar_edge_label(u_char *p, u_char *end,
    u_char *s, size_t len);


static char  *ngx_http_nalar_edge_classes[] = {
    "1xx", "2xx", "3xx", "4xx", "5xx", "error", "timeout", "aborted"
};

static char  *ngx_http_nalar_edge_reasons[] = {
    NULL, NULL, "no_key", "no_identity", "too_long", "error"
};


ngx_int_t
ngx_http_nalar_edge_status_init(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_LOG_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_nalar_edge_log;

    return NGX_OK;
}


/*
 * nalar_edge_zone NAME | off;
 * Count this location's requests in the shared zone NAME.
 */

char *
ngx_http_nalar_edge_zone(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_loc_conf_t *nlcf = conf;

    ngx_str_t  *value;

    if (nlcf->edge_zone != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "off") == 0) {
        nlcf->edge_zone = NULL;
        return NGX_CONF_OK;
    }

    nlcf->edge_zone = ngx_http_nalar_edge_zone_add(cf, &value[1]);

    return nlcf->edge_zone ? NGX_CONF_OK : NGX_CONF_ERROR;
}


/*
 * nalar_edge_metrics NAME;
 * The zone's counters in the Prometheus text format.
 */

char *
ngx_http_nalar_edge_metrics(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_loc_conf_t *nlcf = conf;

    ngx_str_t                 *value;
    ngx_http_core_loc_conf_t  *clcf;

    if (nlcf->edge_metrics) {
        return "is duplicate";
    }

    value = cf->args->elts;

    nlcf->edge_metrics = ngx_http_nalar_edge_zone_add(cf, &value[1]);
    if (nlcf->edge_metrics == NULL) {
        return NGX_CONF_ERROR;
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_nalar_edge_metrics_handler;

    return NGX_CONF_OK;
}


/*
 * nalar_edge_health UPSTREAM;
 * The edge's readiness from the state nginx keeps of UPSTREAM's servers.
 * The name is looked up as proxy_pass looks it up, so the upstream block
 * may come later in the file.
 */

char *
ngx_http_nalar_edge_health(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_nalar_loc_conf_t *nlcf = conf;

    ngx_url_t                  u;
    ngx_str_t                 *value;
    ngx_http_core_loc_conf_t  *clcf;

    if (nlcf->edge_health) {
        return "is duplicate";
    }

    value = cf->args->elts;

    ngx_memzero(&u, sizeof(ngx_url_t));

    u.url = value[1];
    u.no_resolve = 1;

    nlcf->edge_health = ngx_http_upstream_add(cf, &u, 0);
    if (nlcf->edge_health == NULL) {
        return NGX_CONF_ERROR;
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_nalar_edge_health_handler;

    return NGX_CONF_OK;
}


/* the zone NAME, of the one size every edge zone has */

static ngx_shm_zone_t *
ngx_http_nalar_edge_zone_add(ngx_conf_t *cf, ngx_str_t *name)
{
    ngx_shm_zone_t  *zone;

    zone = ngx_shared_memory_add(cf, name, NGX_HTTP_NALAR_EDGE_ZONE_SIZE,
                                 &ngx_nalar_module);
    if (zone == NULL) {
        return NULL;
    }

    zone->init = ngx_http_nalar_edge_init_zone;

    return zone;
}


/*
 * Once per cycle: the counters of the zone as it was (a reload keeps the
 * zone and its counters), or new ones, all zero.
 */

static ngx_int_t
ngx_http_nalar_edge_init_zone(ngx_shm_zone_t *shm_zone, void *data)
{
    size_t                        len;
    ngx_slab_pool_t              *shpool;
    ngx_http_nalar_edge_stats_t  *st;

    if (data) {
        shm_zone->data = data;
        return NGX_OK;
    }

    shpool = (ngx_slab_pool_t *) shm_zone->shm.addr;

    if (shm_zone->shm.exists) {
        shm_zone->data = shpool->data;
        return NGX_OK;
    }

    st = ngx_slab_calloc(shpool, sizeof(ngx_http_nalar_edge_stats_t));
    if (st == NULL) {
        return NGX_ERROR;
    }

    shpool->data = st;
    shm_zone->data = st;

    len = sizeof(" in nalar_edge_zone \"\"") + shm_zone->shm.name.len;

    shpool->log_ctx = ngx_slab_alloc(shpool, len);
    if (shpool->log_ctx == NULL) {
        return NGX_ERROR;
    }

    ngx_sprintf(shpool->log_ctx, " in nalar_edge_zone \"%V\"%Z",
                &shm_zone->shm.name);

    return NGX_OK;
}


/* The log phase: one count per request, in the location that ended it. */

static ngx_int_t
ngx_http_nalar_edge_log(ngx_http_request_t *r)
{
    ngx_str_t                    *peer;
    ngx_uint_t                    i, status, outcome, tries;
    ngx_str_t                     none = ngx_string("-");
    ngx_http_nalar_ctx_t         *ctx;
    ngx_http_upstream_srv_conf_t *uscf;
    ngx_http_upstream_state_t    *state;
    ngx_http_nalar_edge_node_t   *node;
    ngx_http_nalar_edge_stats_t  *st;
    ngx_http_nalar_loc_conf_t    *nlcf;

    /* a subrequest is logged too where log_subrequest is on: it is part
     * of its main request, which is counted */

    if (r != r->main) {
        return NGX_OK;
    }

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);

    if (nlcf->edge_zone == NULL || nlcf->edge_zone->data == NULL) {
        return NGX_OK;
    }

    st = nlcf->edge_zone->data;

    /* the status the edge sent, as $status has it */

    if (r->err_status) {
        status = r->err_status;

    } else {
        status = r->headers_out.status;
    }

    if (status >= 100 && status < 600) {
        (void) ngx_atomic_fetch_add(&st->requests[status / 100 - 1], 1);
    }

    ctx = ngx_http_get_module_ctx(r, ngx_nalar_module);

    if (ctx) {
        if (ctx->route_key.len) {
            (void) ngx_atomic_fetch_add(&st->route_keys[ctx->route_text], 1);
        }

        if (ctx->edge_sign != NGX_HTTP_NALAR_SIGN_NONE) {
            (void) ngx_atomic_fetch_add(&st->sign[ctx->edge_sign], 1);
        }
    }

    if (r->upstream_states == NULL || r->upstream_states->nelts == 0) {
        return NGX_OK;
    }

    uscf = r->upstream ? r->upstream->upstream : NULL;
    state = r->upstream_states->elts;
    tries = 0;

    for (i = 0; i < r->upstream_states->nelts; i++) {
        peer = state[i].peer ? state[i].peer : &none;

        if (uscf && state[i].header_time == (ngx_msec_t) -1
            && peer->len == uscf->host.len
            && ngx_strncmp(peer->data, uscf->host.data, peer->len) == 0)
        {
            (void) ngx_atomic_fetch_add(&st->no_live, 1);
            continue;
        }

        tries++;

        /* header_time is -1 until the node's header came (connect and
         * header timers start it so); the status is then what nginx
         * made of the failure: 504 for a timeout, 502 for the rest, 0
         * when the request ended before anything failed */

        if (state[i].header_time != (ngx_msec_t) -1
            && state[i].status >= 100 && state[i].status < 600)
        {
            outcome = state[i].status / 100 - 1;

        } else if (state[i].status == NGX_HTTP_GATEWAY_TIME_OUT) {
            outcome = NGX_HTTP_NALAR_TRY_TIMEOUT;

        } else if (state[i].status) {
            outcome = NGX_HTTP_NALAR_TRY_ERROR;

        } else {
            outcome = NGX_HTTP_NALAR_TRY_ABORTED;
        }

        node = ngx_http_nalar_edge_node(nlcf->edge_zone, peer);
        if (node == NULL) {
            (void) ngx_atomic_fetch_add(&st->nodes_dropped, 1);
            continue;
        }

        (void) ngx_atomic_fetch_add(&node->tries[outcome], 1);
    }

    if (tries > 1) {
        (void) ngx_atomic_fetch_add(&st->retries, tries - 1);
    }

    return NGX_OK;
}


/* The node's slot, filled now if it is new; NULL: the table is full. */

static ngx_http_nalar_edge_node_t *
ngx_http_nalar_edge_node(ngx_shm_zone_t *zone, ngx_str_t *addr)
{
    size_t                        len;
    ngx_uint_t                    i, n;
    ngx_slab_pool_t              *shpool;
    ngx_http_nalar_edge_node_t   *node;
    ngx_http_nalar_edge_stats_t  *st;

    st = zone->data;
    len = ngx_min(addr->len, NGX_HTTP_NALAR_EDGE_ADDR);

    n = st->n_nodes;
    ngx_memory_barrier();

    for (i = 0; i < n; i++) {
        node = &st->nodes[i];

        if (node->len == len && ngx_memcmp(node->addr, addr->data, len) == 0)
        {
            return node;
        }
    }

    shpool = (ngx_slab_pool_t *) zone->shm.addr;

    ngx_shmtx_lock(&shpool->mutex);

    /* another worker may have added it, or others, meanwhile */

    for (i = 0; i < st->n_nodes; i++) {
        node = &st->nodes[i];

        if (node->len == len && ngx_memcmp(node->addr, addr->data, len) == 0)
        {
            ngx_shmtx_unlock(&shpool->mutex);
            return node;
        }
    }

    if (i == NGX_HTTP_NALAR_EDGE_NODES) {
        ngx_shmtx_unlock(&shpool->mutex);
        return NULL;
    }

    node = &st->nodes[i];
    ngx_memcpy(node->addr, addr->data, len);
    node->len = len;

    ngx_memory_barrier();

    st->n_nodes = i + 1;

    ngx_shmtx_unlock(&shpool->mutex);

    return node;
}


/* Prometheus text exposition of a zone's counters. */

static ngx_int_t
ngx_http_nalar_edge_metrics_handler(ngx_http_request_t *r)
{
    u_char                       *p, *end;
    size_t                        size;
    ngx_buf_t                    *b;
    ngx_uint_t                    i, k, n;
    ngx_http_nalar_edge_node_t   *node;
    ngx_http_nalar_edge_stats_t  *st;
    ngx_http_nalar_loc_conf_t    *nlcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    if (ngx_http_discard_request_body(r) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);
    st = nlcf->edge_metrics->data;

    if (st == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    n = st->n_nodes;
    ngx_memory_barrier();

    /* a label is escaped into at most twice its bytes */

    size = 4096 + n * NGX_HTTP_NALAR_TRY_N
                  * (96 + 2 * NGX_HTTP_NALAR_EDGE_ADDR);

    b = ngx_create_temp_buf(r->pool, size);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    p = b->last;
    end = b->end;

    p = ngx_slprintf(p, end,
            "# HELP nalar_edge_requests_total Requests the edge answered, "
            "by the status class it sent.\n"
            "# TYPE nalar_edge_requests_total counter\n");

    for (k = 0; k < 5; k++) {
        p = ngx_slprintf(p, end,
                         "nalar_edge_requests_total{code=\"%s\"} %uA\n",
                         ngx_http_nalar_edge_classes[k], st->requests[k]);
    }

    p = ngx_slprintf(p, end,
            "# HELP nalar_edge_route_keys_total Route keys worked out, by "
            "whether the body gave prompt text.\n"
            "# TYPE nalar_edge_route_keys_total counter\n"
            "nalar_edge_route_keys_total{prompt=\"yes\"} %uA\n"
            "nalar_edge_route_keys_total{prompt=\"no\"} %uA\n",
            st->route_keys[1], st->route_keys[0]);

    p = ngx_slprintf(p, end,
            "# HELP nalar_edge_identities_signed_total Requests whose "
            "identity the edge signed for the nodes.\n"
            "# TYPE nalar_edge_identities_signed_total counter\n"
            "nalar_edge_identities_signed_total %uA\n",
            st->sign[NGX_HTTP_NALAR_SIGN_OK]);

    p = ngx_slprintf(p, end,
            "# HELP nalar_edge_identity_failures_total Requests whose "
            "identity could not be signed, by reason.\n"
            "# TYPE nalar_edge_identity_failures_total counter\n");

    for (k = NGX_HTTP_NALAR_SIGN_NO_KEY; k <= NGX_HTTP_NALAR_SIGN_ERROR; k++) {
        p = ngx_slprintf(p, end,
                         "nalar_edge_identity_failures_total{reason=\"%s\"} "
                         "%uA\n", ngx_http_nalar_edge_reasons[k], st->sign[k]);
    }

    p = ngx_slprintf(p, end,
            "# HELP nalar_edge_upstream_retries_total Tries of a node "
            "beyond each request's first.\n"
            "# TYPE nalar_edge_upstream_retries_total counter\n"
            "nalar_edge_upstream_retries_total %uA\n"
            "# HELP nalar_edge_upstream_no_live_total Requests for which "
            "nginx had no node left to try.\n"
            "# TYPE nalar_edge_upstream_no_live_total counter\n"
            "nalar_edge_upstream_no_live_total %uA\n"
            "# HELP nalar_edge_upstream_nodes_dropped_total Tries not "
            "counted by node: the node table was full.\n"
            "# TYPE nalar_edge_upstream_nodes_dropped_total counter\n"
            "nalar_edge_upstream_nodes_dropped_total %uA\n",
            st->retries, st->no_live, st->nodes_dropped);

    p = ngx_slprintf(p, end,
            "# HELP nalar_edge_upstream_tries_total Tries of a node, by "
            "node and outcome (its status class, or no answer).\n"
            "# TYPE nalar_edge_upstream_tries_total counter\n");

    for (i = 0; i < n; i++) {
        node = &st->nodes[i];

        for (k = 0; k < NGX_HTTP_NALAR_TRY_N; k++) {
            p = ngx_slprintf(p, end, "nalar_edge_upstream_tries_total"
                                     "{node=\"");
            p = ngx_http_nalar_edge_label(p, end, node->addr, node->len);
            p = ngx_slprintf(p, end, "\",outcome=\"%s\"} %uA\n",
                             ngx_http_nalar_edge_classes[k],
                             node->tries[k]);
        }
    }

    b->last = p;

    return ngx_http_nalar_send_metrics(r, b);
}


/* a label value as the exposition format escapes it */

static u_char *
ngx_http_nalar_edge_label(u_char *p, u_char *end, u_char *s, size_t len)
{
    size_t  i;

    for (i = 0; i < len && end - p >= 2; i++) {
        switch (s[i]) {
        case '\\':
        case '"':
            *p++ = '\\';
            *p++ = s[i];
            break;
        case '\n':
            *p++ = '\\';
            *p++ = 'n';
            break;
        default:
            *p++ = s[i];
        }
    }

    return p;
}


/*
 * {"status": "ok" | "degraded" | "failed", "upstream": NAME,
 *  "nodes": [{"id": ADDRESS, "status": "up" | "failed" | "down",
 *             "fails": N, "backup": BOOL}, ...]}
 *
 * A server is "down" when the configuration says so, "failed" while
 * nginx leaves it alone (max_fails failures, the last within
 * fail_timeout), else "up" (nginx would try it: one never tried is up).
 * 200 while one is up ("ok" when all are), 503 when none is.
 */

static ngx_int_t
ngx_http_nalar_edge_health_handler(ngx_http_request_t *r)
{
    json_t                        *root, *nodes, *m;
    time_t                         now;
    ngx_int_t                      rc;
    ngx_uint_t                     up, total, backup, fails;
    const char                    *s;
    ngx_http_upstream_rr_peer_t   *peer;
    ngx_http_upstream_rr_peers_t  *peers, *list;
    ngx_http_nalar_loc_conf_t     *nlcf;
    ngx_http_upstream_srv_conf_t  *uscf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    if (ngx_http_discard_request_body(r) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    nlcf = ngx_http_get_module_loc_conf(r, ngx_nalar_module);
    uscf = nlcf->edge_health;

    /* nginx's balancers (round robin, hash, ip_hash, least_conn,
     * random, with keepalive and zone) keep the round-robin list here */

    peers = uscf->peer.data;

    nodes = json_array();
    if (nodes == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    now = ngx_time();
    up = 0;
    total = 0;
    backup = 0;

    for (list = peers; list; list = list->next, backup = 1) {

        ngx_http_upstream_rr_peers_rlock(list);

        for (peer = list->peer; peer; peer = peer->next) {

            ngx_http_upstream_rr_peer_lock(list, peer);

            fails = peer->fails;

            if (peer->down) {
                s = "down";

            } else if (peer->max_fails && peer->fails >= peer->max_fails
                       && now - peer->checked <= peer->fail_timeout)
            {
                s = "failed";

            } else {
                s = "up";
                up++;
            }

            ngx_http_upstream_rr_peer_unlock(list, peer);

            total++;

            m = json_pack("{s:s%,s:s,s:I,s:b}",
                          "id", peer->name.data, peer->name.len,
                          "status", s, "fails", (json_int_t) fails,
                          "backup", (int) backup);

            if (m == NULL || json_array_append_new(nodes, m) != 0) {
                ngx_http_upstream_rr_peers_unlock(list);
                json_decref(nodes);
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }
        }

        ngx_http_upstream_rr_peers_unlock(list);
    }

    root = json_pack("{s:s,s:s%,s:o}",
                     "status", up == 0 ? "failed"
                                       : (up == total ? "ok" : "degraded"),
                     "upstream", uscf->host.data, uscf->host.len,
                     "nodes", nodes);
    if (root == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    rc = ngx_http_nalar_send_json(r, up ? NGX_HTTP_OK
                                        : NGX_HTTP_SERVICE_UNAVAILABLE, root);
    json_decref(root);

    return rc;
}
