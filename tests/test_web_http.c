/* test_web_http.c - the HTTP plumbing both servers share (web/httpd.c): one rule for a listen
 * address, which kiln registry serve and kiln runs serve both apply (localhost is 127.0.0.1
 * for both: the registry refused it before, while kiln runs serve took it). */
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "test.h"

#include "registry.h"
#include "testutil.h"
#include "web.h"

static bool v4_is(const char *listen, const char *ip, unsigned port) {
    struct sockaddr_storage ss;
    bool v6 = true;
    if (kiln_web_listen_parse(listen, &ss, &v6) != KILN_OK || v6) return false;
    const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
    char got[INET_ADDRSTRLEN];
    return a->sin_family == AF_INET && ntohs(a->sin_port) == port &&
           inet_ntop(AF_INET, &a->sin_addr, got, sizeof got) && !strcmp(got, ip);
}

KILN_TEST(web_listen_address_rule) {
    CHECK("IPv4 and a port", v4_is("127.0.0.1:8080", "127.0.0.1", 8080));
    CHECK("localhost is 127.0.0.1", v4_is("localhost:0", "127.0.0.1", 0));
    CHECK("any address, the largest port", v4_is("0.0.0.0:65535", "0.0.0.0", 65535));
    struct sockaddr_storage ss;
    bool v6 = false;
    CHECK("[IPv6]:PORT", kiln_web_listen_parse("[::1]:443", &ss, &v6) == KILN_OK && v6 &&
                             ntohs(((struct sockaddr_in6 *)&ss)->sin6_port) == 443);
    static const char *const bad[] = {
        "",
        ":80",
        "127.0.0.1",
        "127.0.0.1:",
        "127.0.0.1:65536",
        "127.0.0.1:-1",
        "127.0.0.1: 80",
        "127.0.0.1:+80",
        "127.0.0.1:0x50",
        "127.0.0.1:80 ",
        "example.com:80",
        "localhost",
        "[::1]",
        "[::1]80",
        "::1:80",
        "[127.0.0.1]:80",
        "[::1]:",
        "127.1:80",
        "1.2.3.4.5:80",
        "localhost.:80",
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        char what[96];
        snprintf(what, sizeof what, "'%s' is refused, naming it", bad[i]);
        kiln_errclear();
        CHECK(what, kiln_web_listen_parse(bad[i], &ss, &v6) == KILN_ERR_USAGE &&
                        (!*bad[i] || kiln_test_msg_has(bad[i], NULL)));
    }
}

/* The registry takes the same rule: localhost:0 serves on 127.0.0.1; a name is refused before
 * the store is made. */
KILN_TEST(web_listen_rule_is_the_registrys) {
    char *root = kiln_test_path("store");
    kiln_registry_server_opts o = {.root = root, .listen = "localhost:0"};
    kiln_registry_server *s = NULL;
    kiln_err rc = kiln_registry_server_start(&o, &s);
    CHECK("the registry serves on localhost:0", rc == KILN_OK && s);
    CHECK("... on a port", s && kiln_registry_server_port(s) > 0);
    kiln_registry_server_stop(s, 0);
    char *root2 = kiln_test_path("store2");
    o = (kiln_registry_server_opts){.root = root2, .listen = "example.com:0"};
    s = NULL;
    CHECK("a host name is refused", kiln_registry_server_start(&o, &s) == KILN_ERR_USAGE && !s &&
                                        kiln_test_msg_has("'example.com' is not an IPv4", NULL));
    CHECK("... before the store is made", !kiln_path_exists(root2));
    free(root);
    free(root2);
}
