/* test_model_format.c - the config parser and the parameter table against the vectors. */
#include <stdlib.h>
#include <string.h>

#include "test.h"

KILN_TEST(model_format_table_matches_vectors) {
    const char *files[] = {"tsmoe-moe.model.safetensors", "tsmoe-dense.model.safetensors"};
    for (size_t f = 0; f < 2; f++) {
        char *p = kiln_test_vector(files[f]);
        kiln_st *st;
        if (!CHECK("open vector", kiln_st_open(p, &st) == KILN_OK)) {
            free(p);
            continue;
        }
        kiln_model_config cfg;
        CHECK("config parses", kiln_model_config_from_st(st, &cfg) == KILN_OK);
        kiln_param *tab;
        size_t n, total;
        if (CHECK("table", kiln_param_table(&cfg, &tab, &n, &total) == KILN_OK)) {
            CHECK("same tensor count", n == kiln_st_count(st));
            size_t sum = 0;
            for (size_t i = 0; i < n; i++) {
                CHECK(tab[i].name, kiln_st_expect(st, tab[i].name, KILN_F32, tab[i].ndim, tab[i].shape, NULL) == KILN_OK);
                CHECK("offsets contiguous", tab[i].offset == sum);
                sum += tab[i].numel;
            }
            CHECK("total", sum == total);
            CHECK("norm.in_* not trained", !(tab[0].flags & KILN_PARAM_TRAINED) && !(tab[1].flags & KILN_PARAM_TRAINED));
            long e = kiln_param_find(tab, n, "embed.bias");
            CHECK("biases not decayed", e >= 0 && tab[e].flags == KILN_PARAM_TRAINED);
            free(tab);
        }
        char *text = kiln_model_config_text(&cfg);
        json_t *j;
        kiln_model_config back;
        CHECK("config text round trip", text && kiln_json_parse(text, strlen(text), "t", &j) == KILN_OK &&
                                            kiln_model_config_parse(j, "t", &back) == KILN_OK &&
                                            memcmp(&back, &cfg, sizeof cfg) == 0);
        json_decref(j);
        free(text);
        kiln_st_close(st);
        free(p);
    }
}

static kiln_err parse_cfg(const char *text) {
    json_t *j;
    kiln_model_config c;
    KILN_TRY(kiln_json_parse(text, strlen(text), "cfg", &j));
    kiln_err rc = kiln_model_config_parse(j, "cfg", &c);
    json_decref(j);
    return rc;
}

KILN_TEST(model_format_config_errors) {
#define BASE "\"format\":\"kiln-tsmoe/1\",\"n_features\":3,\"n_outputs\":1,\"d_model\":8,\"n_layers\":1,\"d_ff\":4,\"seq_len\":8,\"attn_window\":4"
    CHECK("valid", parse_cfg("{" BASE ",\"n_heads\":2,\"n_experts\":0,\"top_k\":0}") == KILN_OK);
    CHECK("unknown key", parse_cfg("{" BASE ",\"n_heads\":2,\"n_experts\":0,\"top_k\":0,\"bogus\":1}") == KILN_ERR_CONFIG &&
                             strstr(kiln_errmsg(), "bogus"));
    CHECK("heads must divide", parse_cfg("{" BASE ",\"n_heads\":3,\"n_experts\":0,\"top_k\":0}") == KILN_ERR_CONFIG &&
                                   strstr(kiln_errmsg(), "n_heads"));
    CHECK("top_k over experts", parse_cfg("{" BASE ",\"n_heads\":2,\"n_experts\":2,\"top_k\":3}") == KILN_ERR_CONFIG);
    CHECK("top_k without experts", parse_cfg("{" BASE ",\"n_heads\":2,\"n_experts\":0,\"top_k\":1}") == KILN_ERR_CONFIG);
    CHECK("missing key", parse_cfg("{" BASE ",\"n_heads\":2,\"n_experts\":0}") == KILN_ERR_CONFIG &&
                             strstr(kiln_errmsg(), "top_k"));
    CHECK("wrong format", parse_cfg("{\"format\":\"other\"}") == KILN_ERR_FORMAT);
#undef BASE
}
