/* mhd_modes.c MODE (bench/bench_mhd_modes.sh): libmicrohttpd 0.9.75 set up as web/httpd.c sets it
 * up (a pool of 4, 64 connections an address, a 10 s header timeout set on connect, 120 s idle)
 * in one of its threading modes: epoll (kiln's) | poll | select | tpc (a thread per connection,
 * poll). Prints the port; answers "ok\n". For the CLOSE-WAIT question of issue 29 item 9. */
#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static enum MHD_Result h(void *cls, struct MHD_Connection *c, const char *url, const char *m,
                         const char *v, const char *up, size_t *us, void **st) {
    if (!*st) { *st = (void *)1; return MHD_YES; }
    const union MHD_ConnectionInfo *to = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_TIMEOUT);
    if (!to || to->connection_timeout != 120) MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 120);
    struct MHD_Response *r = MHD_create_response_from_buffer(3, "ok\n", MHD_RESPMEM_PERSISTENT);
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}
static void note(void *cls, struct MHD_Connection *c, void **sc, enum MHD_ConnectionNotificationCode t) {
    if (t == MHD_CONNECTION_NOTIFY_STARTED) MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 10);
}
int main(int argc, char **argv) {
    const char *m = argv[1];
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, pool = 4;
    if (!strcmp(m, "epoll")) flags |= MHD_USE_EPOLL | MHD_USE_ITC;
    else if (!strcmp(m, "poll")) flags |= MHD_USE_POLL | MHD_USE_ITC;
    else if (!strcmp(m, "select")) flags |= MHD_USE_ITC;
    else if (!strcmp(m, "tpc")) { flags |= MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ITC; pool = 0; }
    sigset_t set; sigemptyset(&set); sigaddset(&set, SIGTERM); sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    struct MHD_Daemon *d = pool
        ? MHD_start_daemon(flags, 0, NULL, NULL, h, NULL, MHD_OPTION_THREAD_POOL_SIZE, pool,
              MHD_OPTION_NOTIFY_CONNECTION, note, NULL, MHD_OPTION_CONNECTION_TIMEOUT, 120u,
              MHD_OPTION_CONNECTION_LIMIT, 4000u, MHD_OPTION_PER_IP_CONNECTION_LIMIT, 64u, MHD_OPTION_END)
        : MHD_start_daemon(flags, 0, NULL, NULL, h, NULL,
              MHD_OPTION_NOTIFY_CONNECTION, note, NULL, MHD_OPTION_CONNECTION_TIMEOUT, 120u,
              MHD_OPTION_CONNECTION_LIMIT, 4000u, MHD_OPTION_PER_IP_CONNECTION_LIMIT, 64u, MHD_OPTION_END);
    if (!d) { fprintf(stderr, "no daemon\n"); return 1; }
    printf("%u\n", MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port); fflush(stdout);
    int sig; sigwait(&set, &sig);
    MHD_stop_daemon(d);
    return 0;
}
