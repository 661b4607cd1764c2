/* registry_int.h - the whole registry's internals, for what sits beside the two sides
 * rather than in one (registry/release.c) and for the tests: the common pieces, the
 * server's and the client's. A file of registry/common, registry/server or registry/client
 * includes its own side's header instead (docs/architecture.md, "Layering check"). */
#ifndef KILN_REGISTRY_INT_H
#define KILN_REGISTRY_INT_H

#include "client_int.h"
#include "registry_common.h"
#include "server_int.h"

#endif
