/* registry_fx.h - the fixtures the registry's C tests share (test_registry*.c, test_web*.c): a
 * registry in the test directory served in-process on a loopback port, a raw HTTP client, the
 * store's SQLite read and tampered with behind the server's back, signed archives, channel
 * records and trust versions, and a loopback listener for the stub servers a test writes.
 * (testutil.h holds what tests of any area share; this is the registry's.) */
#ifndef KILN_REGISTRY_FX_H
#define KILN_REGISTRY_FX_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "kiln.h"
#include "registry.h"
#include "sign.h"

/* ---- a registry on loopback ---- */

/* A store in the test directory and the server on it. The tokens are those rfx_init was asked
 * for (NULL otherwise): admin 'ops', pub 'ci' (publish), prom 'rm' (promote), rd 'viewer'
 * (read). */
typedef struct rfx {
    char root[1024], trust[1024], state[1024], url[64];
    uint16_t port;
    kiln_registry_server *srv;
    int threads;        /* the server's workers */
    bool read_required; /* reads need a token */
    char *admin, *pub, *prom, *rd;
} rfx;

/* root = DIR/store, trust = DIR/trust.json holding policy, state = DIR/state (DIR: the test
 * directory); a token per scope in tokens (KILN_SCOPE_ADMIN, _PUBLISH, _PROMOTE, _READ bits,
 * made in that order); the server started with that policy. False on any failure; rfx_free
 * frees what was made either way. */
bool rfx_init(rfx *r, const char *store, const char *policy, unsigned tokens, int threads,
              bool read_required);
/* (Re)start the server on r->root with the trust policy at trust (NULL: none): port and url
 * are its new ones. */
bool rfx_start(rfx *r, const char *trust);
/* Stop the server, free the tokens. A zeroed rfx is fine. */
void rfx_free(rfx *r);
/* The server on root (what rfx_start does, for a store without an rfx): stops *srv first,
 * starts the new one there, url gets its address; its port, 0 when it did not start. */
uint16_t rfx_serve(const char *root, const char *trust, bool read_required, int threads,
                   kiln_registry_server **srv, char url[64]);
/* What a service watching demo@staging on r's server passes kiln_watch_start: the policy at
 * trust, r's state, pulls into dir every 20 ms, each outcome to on_update(ctx). */
kiln_watch_opts rfx_watch_opts(const rfx *r, const char *trust, const char *dir,
                               void (*on_update)(void *ctx, kiln_err rc, const char *message,
                                                 const kiln_pull_result *res),
                               void *ctx);

/* ---- HTTP ---- */

/* An answer: the status (0: none came), the body (NUL-terminated, "" when there is none) and
 * the header lines as far as they fit. Zero it before the first request; each request frees
 * the last one's body; rfx_resp_free frees the last. */
typedef struct rfx_resp {
    long status;
    char *body;
    size_t len;
    char hdr[4096];
    size_t hlen;
} rfx_resp;

/* One request to base (http://127.0.0.1:PORT) + path: method ("HEAD" asks for no body), a
 * bearer token, a body and extra header lines (NULL-terminated), each when not NULL. The
 * answer goes to out (NULL: dropped); returns its status. */
long rfx_http(const char *base, const char *method, const char *path, const char *token,
              const char *body, const char *const *headers, rfx_resp *out);
void rfx_resp_free(rfx_resp *r);
/* GET base/metrics (with token when not NULL) until its answer holds each of want
 * (NULL-terminated), for a second at most: the server counts a request once it has sent the
 * answer, which may be just after its client read it. The last answer stays in out; true when
 * every line was there (else the first missing one is printed). */
bool rfx_metrics_have(const char *base, const char *token, const char *const *want, rfx_resp *out);

/* ---- the store's SQLite, behind the server's back ---- */

/* How a helper reaches the database: RFX_OPEN as the registry opens a store (the directories,
 * the schema and its migrations made first where missing: a dropped table comes back), or
 * RFX_CONNECT as the server does per request (an existing store; nothing made or changed). */
typedef enum { RFX_OPEN, RFX_CONNECT } rfx_db;

/* The first column of the first row of sql as an integer; -1 when it cannot run or has no row. */
int64_t rfx_int(const char *root, rfx_db how, const char *sql);
/* The same as text; NULL when it cannot run, has no row or the value is NULL. Caller frees. */
char *rfx_text(const char *root, rfx_db how, const char *sql);
/* Run one statement (an operator by hand, a compromised server): ?1 bound to text when not
 * NULL, ?2 (where the statement has it) to the time now. False when it fails. */
bool rfx_sql(const char *root, rfx_db how, const char *sql, const char *text);

/* ---- what a registry holds ---- */

/* A card whose lineage is the least a card carries. */
#define RFX_CARD                                                                                   \
    "{\"name\":\"demo\",\"created\":\"2026-03-04T05:06:07Z\",\"lineage\":{\"run_id\":\"r\","       \
    "\"step\":1,\"dataset_sha256\":\"ab\",\"code_version\":\"0.1.0\",\"metrics\":{}}}"

/* n fresh key pairs: the secret keys in sk, the public keys (base64) in b64. False on failure;
 * rfx_keys_free frees what was made either way. */
bool rfx_keys(kiln_sign_seckey **sk, char (*b64)[KILN_SIGN_PUBKEY_B64], int n);
void rfx_keys_free(kiln_sign_seckey **sk, int n);

/* The trust policy most registry tests use (caller frees): release key rel, promote keys p1
 * and p2 (public keys, base64), staging needs 1 promote signature and production 2,
 * unvalidated archives accepted. */
char *rfx_policy(const char *rel, const char *p1, const char *p2);
/* Sign archive as `kiln sign [--allow-unvalidated]` does, adding a block to ARCHIVE.minisig
 * (a second key co-signs). */
bool rfx_sign(kiln_sign_seckey *sk, const char *archive, bool allow_unvalidated);
/* The model directory `name` in the test directory (weights, card.json holding card), packed
 * as demo@version into name.kiln and signed with sk as `kiln sign --allow-unvalidated` signs
 * (a signature left by an earlier archive of that name is dropped first). The archive's path
 * (caller frees) and its digest's hex; NULL on failure. */
char *rfx_archive(const char *name, const void *weights, size_t len, const char *card,
                  const char *version, kiln_sign_seckey *sk, char hex[KILN_SHA256_HEX]);
/* rfx_archive of a real model: the shared vector file `vector` as the weights (kiln_watch
 * loads them) and RFX_CARD. */
char *rfx_vector_archive(const char *name, const char *vector, const char *version,
                         kiln_sign_seckey *sk, char hex[KILN_SHA256_HEX]);
/* A channel record's text for demo signed by each of keys (NULL-terminated); caller frees,
 * NULL on failure. */
char *rfx_record(const char *channel, const char *version, const char *hex, uint64_t seq,
                 int64_t expires, const char *reason, kiln_sign_seckey *const *keys);
/* A trust policy version: text signed by sk[signers[0]], then co-signed by each further
 * sk[signers[i]] (-1 ends); label names the document in messages. Caller frees; NULL on
 * failure. */
char *rfx_trust_sign(const char *text, const char *label, kiln_sign_seckey *const *sk,
                     const int *signers);

/* ---- stub servers ---- */

/* A socket listening on a free loopback port, and its URL; false (and *fd -1) on failure. */
bool rfx_listen(int *fd, char url[64]);
/* Accept one connection on fd and read its request head into req (NUL-terminated): the
 * connection, or -1 once the listener is closed. */
int rfx_accept(int fd, char *req, size_t size);

/* A port that drops every new connect, as a partition or a dead host's firewall does: a
 * listener with no room left in its accept queue (filled by connections it never accepts),
 * so the kernel ignores further SYNs and a client's connect hangs until its own timeout.
 * fds[0] is the listener, fds[1..2] the connections that fill it; checked with a probe
 * connect that must not complete in 200 ms. false (fds all -1) on failure. */
bool rfx_blackhole(int fds[3], char url[64]);
void rfx_blackhole_close(int fds[3]);

/* A stub server on a thread of its own: each connection's request head goes to
 * answer(ctx, c, req), which answers on c and returns true to have c closed (false: it keeps
 * c, and closes it itself). */
typedef struct rfx_stub {
    int fd;
    char url[64];
    pthread_t thread;
    bool started;
    bool (*answer)(void *ctx, int c, const char *req);
    void *ctx;
} rfx_stub;
bool rfx_stub_start(rfx_stub *s, bool (*answer)(void *ctx, int c, const char *req), void *ctx);
/* Close the listener and join the thread (a connection being answered is finished first). A
 * stub that did not start is fine. */
void rfx_stub_stop(rfx_stub *s);
/* One answer: status, a JSON body (NULL: none), Connection: close. */
void rfx_stub_answer(int c, int status, const char *body);

/* ---- HTTPS ---- */

/* A private CA and a certificate for 127.0.0.1 signed by it (P-256, made with the openssl
 * command, which the Makefile installs) in the test directory: the PEM files' paths. */
bool rfx_tls_files(char ca[1024], char cert[1024], char key[1024]);

#endif
