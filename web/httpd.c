/* httpd.c - the HTTP plumbing both of kiln's servers stand on (kiln registry serve and kiln runs
 * serve): one rule for the listen address, and one libmicrohttpd daemon set up the same way for
 * both: its threads, a connection limit that fits the descriptors the process may open, a
 * per-address limit, and two timeouts (a short one until a connection's first request head is
 * in, so that a slow-loris frees its slot in seconds; the idle one after). Before this file the
 * two servers each had their own, and kiln runs serve had neither the per-address limit nor the
 * header timeout: 300 half-open connections from one address locked every other client out. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "core.h"
#include "web.h"

struct kiln_web_http {
    struct MHD_Daemon *d;
    kiln_web_http_opts o; /* the caller's, defaults filled in */
    uint16_t port;
};

kiln_err kiln_web_listen_parse(const char *listen, struct sockaddr_storage *ss, bool *v6) {
    memset(ss, 0, sizeof *ss);
    *v6 = false;
    KILN_FAIL_IF(!listen || !*listen, KILN_ERR_USAGE, "no listen address given (HOST:PORT)");
    char host[64];
    const char *colon;
    if (listen[0] == '[') {
        const char *close = strchr(listen, ']');
        KILN_FAIL_IF(!close || close[1] != ':' || (size_t)(close - listen - 1) >= sizeof host,
                     KILN_ERR_USAGE, "listen address '%s' is not [IPv6]:PORT", listen);
        memcpy(host, listen + 1, (size_t)(close - listen - 1));
        host[close - listen - 1] = 0;
        colon = close + 1;
        *v6 = true;
    } else {
        colon = strrchr(listen, ':');
        KILN_FAIL_IF(!colon || colon == listen || (size_t)(colon - listen) >= sizeof host,
                     KILN_ERR_USAGE,
                     "listen address '%s' is not HOST:PORT (127.0.0.1:8080, localhost:0, "
                     "[::1]:0)",
                     listen);
        memcpy(host, listen, (size_t)(colon - listen));
        host[colon - listen] = 0;
    }
    /* Digits only: no sign, no space, no hex (strtol would take " +0x1F"). */
    const char *p = colon + 1;
    long port = 0;
    for (; *p >= '0' && *p <= '9' && port <= 65535; p++)
        port = port * 10 + (*p - '0');
    KILN_FAIL_IF(p == colon + 1 || *p || port > 65535, KILN_ERR_USAGE,
                 "listen address '%s': the port must be a number from 0 to 65535", listen);
    if (*v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        KILN_FAIL_IF(inet_pton(AF_INET6, host, &a->sin6_addr) != 1, KILN_ERR_USAGE,
                     "listen address '%s': '%s' is not an IPv6 address", listen, host);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        /* localhost is loopback, not a name to look up (a resolver could say otherwise). */
        const char *ip = strcmp(host, "localhost") ? host : "127.0.0.1";
        KILN_FAIL_IF(inet_pton(AF_INET, ip, &a->sin_addr) != 1, KILN_ERR_USAGE,
                     "listen address '%s': '%s' is not an IPv4 address (nor localhost)", listen,
                     host);
    }
    return KILN_OK;
}

/* Every handler call: once a connection's request head is complete it has the idle timeout
 * (during the request and kept alive after it), no longer the short one for a head. */
static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **state) {
    const kiln_web_http *h = cls;
    const union MHD_ConnectionInfo *to =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_TIMEOUT);
    if (!to || to->connection_timeout != h->o.idle_timeout_s)
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, h->o.idle_timeout_s);
    return h->o.handler(h->o.handler_cls, c, url, method, version, upload, upload_size, state);
}

/* Until its first request head is complete a connection has the short header timeout (the
 * daemon's own is the idle one): set here, where the connection is already on its worker's
 * timeout lists, as libmicrohttpd requires. */
static void conn_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                        enum MHD_ConnectionNotificationCode toe) {
    const kiln_web_http *h = cls;
    (void)socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED && h->o.header_timeout_s != h->o.idle_timeout_s)
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, h->o.header_timeout_s);
    if (h->o.on_connection)
        h->o.on_connection(h->o.connection_cls, toe == MHD_CONNECTION_NOTIFY_STARTED);
}

static void quiet(void *cls, const char *fmt, va_list ap) {
    (void)cls, (void)fmt, (void)ap;
}

kiln_err kiln_web_http_start(const kiln_web_http_opts *o, kiln_web_http **out) {
    *out = NULL;
    KILN_FAIL_IF(!o->handler, KILN_ERR_USAGE, "an HTTP server needs a handler");
    struct sockaddr_storage ss;
    bool v6;
    KILN_TRY(kiln_web_listen_parse(o->listen, &ss, &v6));
    KILN_FAIL_IF(!o->tls_cert != !o->tls_key, KILN_ERR_USAGE,
                 "HTTPS needs both a certificate and its private key");
    kiln_web_http *h = kiln_calloc(1, sizeof *h);
    if (!h) return KILN_ERR_NOMEM;
    h->o = *o;
    kiln_web_http_opts *q = &h->o;
    if (!q->threads) q->threads = 4;
    if (!q->header_timeout_s) q->header_timeout_s = KILN_WEB_HTTP_HEADER_TIMEOUT_S;
    if (!q->idle_timeout_s) q->idle_timeout_s = KILN_WEB_HTTP_IDLE_TIMEOUT_S;
    unsigned per_ip = q->per_ip_connections == KILN_WEB_HTTP_NO_LIMIT ? 0u
                      : q->per_ip_connections                         ? q->per_ip_connections
                                                                      : KILN_WEB_HTTP_PER_IP;
    /* Every connection holds a descriptor; the caller's files and the threads want some too.
     * More connections than the descriptor limit allows would fail at accept(). */
    unsigned max_conn = q->max_connections ? q->max_connections : KILN_WEB_HTTP_MAX_CONNECTIONS;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < (rlim_t)max_conn + KILN_WEB_HTTP_SPARE_FDS) {
        unsigned fit = rl.rlim_cur > 2 * KILN_WEB_HTTP_SPARE_FDS
                           ? (unsigned)(rl.rlim_cur - KILN_WEB_HTTP_SPARE_FDS)
                           : KILN_WEB_HTTP_SPARE_FDS;
        /* Said when the caller asked for that many; the default just fits itself. */
        if (q->max_connections)
            kiln_warn("%s: the file descriptor limit (%llu) leaves room for %u connections, not "
                      "%u (raise it with ulimit -n)",
                      q->what ? q->what : "server", (unsigned long long)rl.rlim_cur, fit, max_conn);
        max_conn = fit;
    }
    q->max_connections = max_conn;
    q->per_ip_connections = per_ip;
    /* Options as an array: the optional callbacks are passed only when given (libmicrohttpd
     * would call a NULL unescape callback). A single pointer goes in the last member, a
     * function and its closure in the two. */
    struct MHD_OptionItem opt[16];
    size_t n = 0;
#define OPT(o, v, p) (opt[n++] = (struct MHD_OptionItem){(o), (intptr_t)(v), (p)})
    OPT(MHD_OPTION_SOCK_ADDR, 0, &ss);
    OPT(MHD_OPTION_THREAD_POOL_SIZE, q->threads, NULL);
    OPT(MHD_OPTION_NOTIFY_CONNECTION, conn_notify, h);
    OPT(MHD_OPTION_CONNECTION_TIMEOUT, q->idle_timeout_s, NULL);
    OPT(MHD_OPTION_CONNECTION_LIMIT, max_conn, NULL);
    OPT(MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip, NULL);
    OPT(MHD_OPTION_EXTERNAL_LOGGER, q->log ? q->log : quiet, NULL);
    if (q->memory_limit) OPT(MHD_OPTION_CONNECTION_MEMORY_LIMIT, q->memory_limit, NULL);
    if (q->completed) OPT(MHD_OPTION_NOTIFY_COMPLETED, q->completed, q->completed_cls);
    if (q->unescape) OPT(MHD_OPTION_UNESCAPE_CALLBACK, q->unescape, NULL);
    if (q->tls_cert) {
        OPT(MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)q->tls_cert);
        OPT(MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)q->tls_key);
    }
    OPT(MHD_OPTION_END, 0, NULL);
#undef OPT
    h->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC | MHD_USE_ERROR_LOG |
            (v6 ? MHD_USE_IPv6 : 0) | (q->tls_cert ? MHD_USE_TLS : 0),
        0, q->accept, q->accept_cls, handler, h, MHD_OPTION_ARRAY, opt, MHD_OPTION_END);
    if (!h->d) {
        free(h);
        return kiln_fail(KILN_ERR_NETWORK, "cannot listen on '%s' (address in use or not local?)",
                         o->listen);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : 0;
    *out = h;
    return KILN_OK;
}

uint16_t kiln_web_http_port(const kiln_web_http *h) {
    return h->port;
}

void kiln_web_http_stop(kiln_web_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
