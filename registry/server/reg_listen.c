/* reg_listen.c - the registry server's start and stop: the trust policy, the TLS certificate
 * and key, the store and the listen address checked before anything is made, the store's lock,
 * the daemon (web/httpd.c) with the handler of reg_routes.c, and a graceful stop. */
#include <dirent.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server_int.h"

/* The registry's defaults are the ones both servers have (web/httpd.c). */
_Static_assert(KILN_REGISTRY_HEADER_TIMEOUT_S == KILN_WEB_HTTP_HEADER_TIMEOUT_S &&
                   KILN_REGISTRY_IDLE_TIMEOUT_S == KILN_WEB_HTTP_IDLE_TIMEOUT_S &&
                   KILN_REGISTRY_MAX_CONNECTIONS == KILN_WEB_HTTP_MAX_CONNECTIONS &&
                   KILN_REGISTRY_SPARE_FDS == KILN_WEB_HTTP_SPARE_FDS,
               "registry.h's server defaults differ from web.h's");

/* A connection opened or closed (the timeouts of a connection are web/httpd.c's). */
static void conn_notify(void *cls, bool opened) {
    kiln_registry_server *s = cls;
    atomic_fetch_add(&s->connections, opened ? 1 : -1);
}

/* Paths stay as sent: the router decodes each segment itself, so an encoded '/' or ".."
 * lands inside a name, where validation refuses it, and never changes the route. */
static size_t no_unescape(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls, (void)c;
    return strlen(s);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n')
        line[--n] = 0;
    kiln_debug("registry: microhttpd: %s", line);
}

/* Bind the listen address once and let it go, before the store is touched: an address in
 * use or not local is refused with nothing made on disk. (The daemon binds it again a moment
 * later, with SO_REUSEADDR as here; losing that race is still reported, only later.) */
static kiln_err probe_listen(const struct sockaddr_storage *ss, bool v6, const char *listen) {
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return kiln_fail_errno(KILN_ERR_NETWORK, "cannot listen on '%s'", listen);
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = v6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    kiln_err rc = KILN_OK;
    if (bind(fd, (const struct sockaddr *)ss, len) != 0)
        rc = kiln_fail_errno(KILN_ERR_NETWORK, "cannot listen on '%s'", listen);
    close(fd);
    return rc;
}

/* Named temporaries left by a server that crashed (where O_TMPFILE is missing). */
static void clear_tmp(const char *root) {
    char *cmd_dir = kiln_path_join(root, "tmp");
    DIR *d = cmd_dir ? opendir(cmd_dir) : NULL;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (!strncmp(e->d_name, "upload-", 7)) {
                char *p = kiln_path_join(cmd_dir, e->d_name);
                if (p) unlink(p);
                free(p);
            }
        closedir(d);
    }
    free(cmd_dir);
}

/* The PEM certificate and key of o (both or neither) into *cert and *key, checked: each
 * parses, and the key is the certificate's. */
static kiln_err tls_load(const kiln_registry_server_opts *o, char **cert, char **key) {
    *cert = *key = NULL;
    if (!o->tls_cert && !o->tls_key) return KILN_OK;
    KILN_FAIL_IF(!o->tls_cert || !o->tls_key, KILN_ERR_USAGE,
                 "HTTPS needs both a certificate and its private key (--tls-cert and --tls-key)");
    KILN_FAIL_IF(MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES, KILN_ERR_UNSUPPORTED,
                 "this libmicrohttpd was built without TLS: serve plain HTTP behind a TLS proxy");
    size_t cl = 0, kl = 0;
    kiln_err rc = kiln_read_file(o->tls_cert, 1 << 20, cert, &cl);
    if (!rc) rc = kiln_read_file(o->tls_key, 1 << 20, key, &kl);
    BIO *cb = NULL, *kb = NULL;
    X509 *x = NULL;
    EVP_PKEY *k = NULL;
    if (!rc) {
        cb = BIO_new_mem_buf(*cert, (int)cl);
        kb = BIO_new_mem_buf(*key, (int)kl);
        if (!cb || !kb) rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    if (!rc && !(x = PEM_read_bio_X509(cb, NULL, NULL, NULL)))
        rc = kiln_fail(KILN_ERR_FORMAT, "'%s': not a PEM certificate", o->tls_cert);
    if (!rc && !(k = PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL)))
        rc = kiln_fail(KILN_ERR_FORMAT, "'%s': not a PEM private key (an unencrypted one)",
                       o->tls_key);
    if (!rc && X509_check_private_key(x, k) != 1)
        rc = kiln_fail(KILN_ERR_VERIFY, "'%s' is not the private key of the certificate '%s'",
                       o->tls_key, o->tls_cert);
    ERR_clear_error();
    X509_free(x);
    EVP_PKEY_free(k);
    BIO_free(cb);
    BIO_free(kb);
    if (rc) {
        free(*cert);
        if (*key) sodium_memzero(*key, kl);
        free(*key);
        *cert = *key = NULL;
    }
    return rc;
}

/* New connections while the server stops are closed at once. (Not MHD_quiesce_daemon: on an
 * epoll daemon with worker threads it races the workers' own removal of the listen socket from
 * their epoll sets, and libmicrohttpd 0.9.75 aborts the process when it loses: "Failed to
 * remove listen FD from epoll set"; registry_server_stops_cleanly_under_load.) */
static enum MHD_Result accept_policy(void *cls, const struct sockaddr *addr, socklen_t len) {
    (void)addr, (void)len;
    kiln_registry_server *s = cls;
    return atomic_load(&s->stopping) ? MHD_NO : MHD_YES;
}

kiln_err kiln_registry_server_start(const kiln_registry_server_opts *o,
                                    kiln_registry_server **out) {
    *out = NULL;
    KILN_FAIL_IF(!o->root || !o->listen, KILN_ERR_USAGE,
                 "the registry needs a root and a listen address");
    KILN_FAIL_IF(sodium_init() < 0, KILN_ERR_INTERNAL, "libsodium failed to initialise");
    struct sockaddr_storage ss;
    bool v6;
    KILN_TRY(kiln_web_listen_parse(o->listen, &ss, &v6));
    kiln_registry_server *s = kiln_calloc(1, sizeof *s);
    if (!s) return KILN_ERR_NOMEM;
    s->lock_fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->trust_mu, NULL);
    pthread_mutex_init(&s->trust_put_mu, NULL);
    kiln_sign_trust *trust = NULL;
    kiln_err rc = KILN_OK;
    sqlite3 *db = NULL;
    char *lock_path = NULL;
    bool made_lock = false;
    s->root = kiln_strdup(o->root);
    KILN_CHECK_IF(rc, fail, !s->root, KILN_ERR_NOMEM, "out of memory");
    s->read_required = o->read_token_required;
    s->max_upload = o->max_upload ? o->max_upload : 16ull << 30;
    /* The policy before the store: a bad --trust must not leave a new store behind. */
    if (o->trust) {
        /* Read once, parsed twice: the policy walked to the one in force, and the one the
         * web page walks the stored versions from, the same bytes. */
        char *text = NULL;
        size_t len = 0;
        KILN_CHECK(rc, fail, kiln_read_file(o->trust, KILN_SIGN_TRUST_FILE_LIMIT, &text, &len));
        rc = kiln_sign_trust_parse(text, len, o->trust, &trust);
        if (!rc) rc = kiln_sign_trust_parse(text, len, o->trust, &s->trust_start);
        free(text);
        if (rc) goto fail;
    }
    /* The certificate and key too (and whether this libmicrohttpd speaks TLS at all). */
    KILN_CHECK(rc, fail, tls_load(o, &s->tls_cert, &s->tls_key));
    /* Likewise the root and the address: a refusal leaves nothing behind. */
    KILN_CHECK(rc, fail, reg_root_check(o->root));
    KILN_CHECK(rc, fail, probe_listen(&ss, v6, o->listen));
    /* A lock file this start makes goes again if the start fails (a corrupt registry.db):
     * a refusal leaves the directory as it found it. */
    lock_path = kiln_path_join(o->root, "lock");
    KILN_CHECK_IF(rc, fail, !lock_path, KILN_ERR_NOMEM, "out of memory");
    bool had_lock = kiln_path_exists(lock_path);
    KILN_CHECK(rc, fail, reg_lock(o->root, &s->lock_fd));
    made_lock = !had_lock && s->lock_fd >= 0;
    KILN_CHECK_IF(rc, fail, s->lock_fd < 0, KILN_ERR_CONFLICT,
                  "'%s' is held by another running server", o->root);
    KILN_CHECK(rc, fail, reg_db_open(o->root, &db));
    {
        reg_mirror_status ms;
        rc = reg_mirror_status_read(db, &ms);
        s->mirror_of = ms.of; /* NULL: a primary */
        ms.of = NULL;
        reg_mirror_status_release(&ms);
        if (rc) {
            reg_db_close(db);
            goto fail;
        }
    }
    if (trust) {
        /* The policy in force: --trust's, walked forward through the stored versions above
         * it, each verified as the successor of the one before. */
        reg_trust_chain chain;
        uint64_t from = kiln_sign_trust_version(trust);
        rc = reg_trust_chain_load(db, o->root, trust, o->trust, NULL, NULL, &chain);
        trust = NULL; /* the chain's now */
        if (!rc) {
            kiln_sign_trust *newest = reg_trust_chain_take_newest(&chain);
            uint64_t to = kiln_sign_trust_version(newest);
            reg_trust_chain_release(&chain);
            rc = reg_trust_swap(s, newest);
            if (!rc && to != from)
                kiln_info("registry: trust policy version %llu in force ('%s' is version %llu; "
                          "the store holds the versions after it)",
                          (unsigned long long)to, o->trust, (unsigned long long)from);
            /* A --trust of a version the store lacks is enforced here but reaches no client
             * that starts below it: clients walk stored versions only. */
            char *doc = NULL;
            size_t dlen;
            if (!rc && to == from && from > 1) {
                if (reg_trust_get(db, from, &doc, &dlen) == KILN_ERR_NOTFOUND)
                    kiln_warn("registry: '%s' is trust version %llu, which the store does not "
                              "hold: clients that trust an older version cannot walk to it "
                              "(serve from the version before it, then kiln trust put this one)",
                              o->trust, (unsigned long long)from);
                free(doc);
                kiln_errclear();
            }
        }
        if (rc) {
            reg_db_close(db);
            db = NULL;
            kiln_errprefix(rc, "cannot serve: ");
            goto fail;
        }
    }
    reg_db_close(db);
    clear_tmp(o->root);
    /* The daemon as kiln runs serve has it (web/httpd.c): the listen rule, the connection
     * limits and the header and idle timeouts are the same for both servers. */
    kiln_web_http_opts ho = {.listen = o->listen,
                             .threads = o->threads,
                             .max_connections = o->max_connections,
                             .per_ip_connections = o->per_ip_connections == KILN_REGISTRY_NO_LIMIT
                                                       ? KILN_WEB_HTTP_NO_LIMIT
                                                       : o->per_ip_connections,
                             .header_timeout_s = o->header_timeout_s,
                             .idle_timeout_s = o->idle_timeout_s,
                             /* room for X-Kiln-Signature: several signers' blocks, base64 */
                             .memory_limit = (size_t)(4 * REG_SIG_MAX),
                             .tls_cert = s->tls_cert,
                             .tls_key = s->tls_key,
                             .handler = reg_http_handler,
                             .handler_cls = s,
                             .accept = accept_policy,
                             .accept_cls = s,
                             .completed = reg_http_completed,
                             .completed_cls = s,
                             .on_connection = conn_notify,
                             .connection_cls = s,
                             .unescape = no_unescape,
                             .log = mhd_log,
                             .what = "registry"};
    KILN_CHECK(rc, fail, kiln_web_http_start(&ho, &s->http));
    s->port = kiln_web_http_port(s->http);
    free(lock_path);
    *out = s;
    return KILN_OK;
fail:
    if (made_lock) unlink(lock_path);
    free(lock_path);
    kiln_sign_trust_free(trust);
    kiln_registry_server_stop(s, 0);
    return rc;
}

uint16_t kiln_registry_server_port(const kiln_registry_server *s) {
    return s->port;
}

void kiln_registry_server_stop(kiln_registry_server *s, unsigned grace_ms) {
    if (!s) return;
    if (s->http) {
        atomic_store(&s->stopping, 1);
        uint64_t deadline = kiln_now_ns() + (uint64_t)grace_ms * 1000000ull;
        while (atomic_load(&s->in_flight) > 0 && kiln_now_ns() < deadline) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        kiln_web_http_stop(s->http); /* closes the listen socket */
    }
    reg_trust_release(s, s->trust);
    kiln_sign_trust_free(s->trust_start);
    free(s->tls_cert);
    if (s->tls_key) sodium_memzero(s->tls_key, strlen(s->tls_key));
    free(s->tls_key);
    reg_unlock(s->lock_fd);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->trust_mu);
    pthread_mutex_destroy(&s->trust_put_mu);
    free(s->rows);
    free(s->root);
    free(s->mirror_of);
    free(s);
}
