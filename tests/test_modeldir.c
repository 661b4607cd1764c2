/* test_modeldir.c - the one rule for what a model directory may hold (core/modeldir.c), as
 * each of its readers applies it: a symlink (to a file that is fine where it is) or a FIFO in
 * a model directory is refused by name, at once, by the runtime's open of the directory and
 * by the reads release and validate make. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln.h"
#include "test.h"
#include "testutil.h"

KILN_TEST(modeldir_refuses_links_and_fifos) {
    const char *d = kiln_test_dir();
    char *md = kiln_test_path("m"), *out = kiln_test_path("outside.json"),
         *lnk = kiln_test_path("m/card.json"), *st = kiln_test_path("m/model.safetensors"),
         *fifo = kiln_test_path("m/fifo.json");
    (void)d;
    kiln_test_put(md, "plain.json", "{\"a\": 1}");
    kiln_test_put(d, "outside.json", "{\"secret\": 1}");
    CHECK("link made", symlink(out, lnk) == 0);
    CHECK("link to a model made", symlink(out, st) == 0);
    CHECK("fifo made", mkfifo(fifo, 0600) == 0);

    json_t *j = NULL;
    CHECK("a plain file reads", kiln_modeldir_json(md, "plain.json", 1 << 20, &j) == KILN_OK &&
                                    json_integer_value(json_object_get(j, "a")) == 1);
    json_decref(j);
    j = NULL;
    CHECK("a linked card is refused",
          kiln_modeldir_json(md, "card.json", 1 << 20, &j) == KILN_ERR_FORMAT);
    CHECK("... named as a symlink", kiln_test_msg_has("m/card.json': is a symlink", NULL));
    CHECK("... and nothing read", j == NULL);
    uint64_t t0 = kiln_now_ns();
    char *buf = NULL;
    size_t len = 0;
    CHECK("a fifo is refused",
          kiln_modeldir_read(md, "fifo.json", 1 << 20, &buf, &len) == KILN_ERR_FORMAT);
    CHECK("... at once, named",
          kiln_now_ns() - t0 < 2000000000ull && kiln_test_msg_has("fifo.json': is a FIFO", NULL));
    CHECK("a missing file is not found",
          kiln_modeldir_read(md, "none.json", 1 << 20, &buf, &len) == KILN_ERR_NOTFOUND);
    kiln_model *m = NULL;
    CHECK("kiln_model_open of the directory refuses its linked weights",
          kiln_model_open(md, &m) == KILN_ERR_FORMAT && !m &&
              kiln_test_msg_has("model.safetensors': is a symlink", NULL));
    kiln_st *s = NULL;
    CHECK("kiln_modeldir_st too",
          kiln_modeldir_st(md, "model.safetensors", &s) == KILN_ERR_FORMAT && !s);
    /* A hard link to a file elsewhere reaches it as surely as a symlink. */
    char *hard = kiln_test_path("m/hard.json");
    CHECK("hard link made", link(out, hard) == 0);
    CHECK("a file with two links is refused",
          kiln_modeldir_read(md, "hard.json", 1 << 20, &buf, &len) == KILN_ERR_FORMAT &&
              kiln_test_msg_has("hard.json': has 2 hard links", NULL));
    free(buf);
    free(md), free(out), free(lnk), free(st), free(fifo), free(hard);
}
