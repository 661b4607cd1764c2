/* cmd_version.c - kiln version. */
#include <stdio.h>

#include "cli.h"
#include "core.h"

int cmd_version(int argc, char **argv) {
    static const cli_spec spec = {"kiln version", "Print the version of kiln and libkiln.", NULL, 0, 0};
    int rc;
    if (!cli_parse_args(&spec, argc, argv, NULL, &rc)) return rc;
    printf("kiln %s\n", kiln_version());
    return 0;
}
