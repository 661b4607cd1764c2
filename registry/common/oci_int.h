/* oci_int.h - the OCI distribution client (oci.c) as oci_kiln.c uses it: one registry named
 * by an oci:// or oci+http:// URL, its manifests, blobs, tags and catalog, every request
 * authenticated as docker, podman and skopeo do it. Private to registry/common. */
#ifndef KILN_REGISTRY_OCI_INT_H
#define KILN_REGISTRY_OCI_INT_H

#include "registry_common.h"

#define REG_OCI_DIGEST 72 /* "sha256:" and 64 hex digits, NUL: a kiln_digest */

typedef struct reg_oci {
    const kiln_registry_client_opts *c;
    char host[256];   /* HOST[:PORT], the auth file's key */
    char base[300];   /* https://HOST[:PORT] (http:// for oci+http://) */
    char prefix[256]; /* the repositories' common prefix ("" for none) */
} reg_oci;

/* c->url parsed (KILN_ERR_USAGE naming what is wrong with it); o keeps c. */
kiln_err reg_oci_open(const kiln_registry_client_opts *c, reg_oci *o);
/* PREFIX/name (caller frees). */
char *reg_oci_repo(const reg_oci *o, const char *name);
/* "sha256:<hex>" of the bytes. */
void reg_oci_sha256(const void *p, size_t n, char out[REG_OCI_DIGEST]);

/* q sent to path (under the registry's base, or an absolute URL of the registry's), with the
 * credentials for scope ("repository:REPO:pull"), answering one 401 challenge. */
kiln_err reg_oci_do(reg_oci *o, const char *scope, reg_http_req *q, const char *path,
                    reg_http_ans *a);

/* The Authorization header line requests for scope carry now (caller wipes and frees), NULL
 * for none: what a download outside reg_oci_do sends. */
char *reg_oci_auth_line(reg_oci *o, const char *scope);

/* A manifest by tag or digest: *body (caller frees) and the digest of its bytes (a digest
 * ref that the bytes do not match is KILN_ERR_VERIFY). KILN_ERR_NOTFOUND when absent. */
kiln_err reg_oci_manifest_get(reg_oci *o, const char *repo, const char *ref, size_t limit,
                              char **body, size_t *len, char digest[REG_OCI_DIGEST]);
/* Whether ref exists, and the digest of the manifest it names now. */
kiln_err reg_oci_manifest_head(reg_oci *o, const char *repo, const char *ref, bool *exists,
                               char digest[REG_OCI_DIGEST]);
kiln_err reg_oci_manifest_put(reg_oci *o, const char *repo, const char *ref, const char *body,
                              size_t len, const char *media_type);
/* A small blob's bytes (at most limit), checked against digest. */
kiln_err reg_oci_blob_get(reg_oci *o, const char *repo, const char *digest, size_t limit,
                          char **body, size_t *len);
kiln_err reg_oci_blob_exists(reg_oci *o, const char *repo, const char *digest, bool *exists);
/* Push a blob (mem, or size bytes of file) unless repo holds it; mounted from mount_from
 * (may be NULL) when the registry can. Checked to be there after. */
kiln_err reg_oci_blob_push(reg_oci *o, const char *repo, const char *mem, const char *file,
                           uint64_t size, const char *digest, const char *mount_from);
/* Every tag of repo, every repository (a JSON array of strings; caller decrefs). */
kiln_err reg_oci_tags(reg_oci *o, const char *repo, json_t **out);
kiln_err reg_oci_catalog(reg_oci *o, json_t **out);

/* ---- what a registry says, parsed (untrusted: tests/fuzz/oci.c) ---- */

/* One parameter of a WWW-Authenticate challenge (name="value" or name=value) into out (cap
 * bytes, NUL-terminated); false when absent or longer than cap - 1. */
bool reg_oci_challenge_param(const char *ch, const char *name, char *out, size_t cap);
/* The next page a Link header names ("</v2/...>; rel=\"next\""), or NULL (caller frees). */
char *reg_oci_link_next(const char *link);
/* A channel record's tag _ch.CHANNEL.SEQ: CHANNEL (1..64 bytes) and SEQ (>= 1, no leading
 * zero); false for any other tag (oci_kiln.c). */
bool reg_oci_record_tag(const char *tag, char ch[KILN_REGISTRY_NAME_MAX + 1], int64_t *seq);

#endif
