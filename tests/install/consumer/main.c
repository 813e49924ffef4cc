/* Stores a block through the installed C ABI and reads it back. */
#include <kvtier.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
  kvtier_options* o = kvtier_options_create();
  kvtier_cache* c = NULL;
  uint32_t tokens[16];
  uint8_t hash[KVTIER_HASH_BYTES];
  unsigned char *in, *out;
  size_t bytes, i;
  int found = 0;
  for (i = 0; i < 16; ++i) tokens[i] = (uint32_t)i;
  if (kvtier_options_set_layout(o, "tiny") != KVTIER_OK || kvtier_open(o, &c) != KVTIER_OK) {
    fprintf(stderr, "open: %s\n", kvtier_last_error());
    return 1;
  }
  kvtier_options_destroy(o);
  bytes = kvtier_block_bytes(c);
  in = malloc(bytes);
  out = malloc(bytes);
  for (i = 0; i < bytes; ++i) in[i] = (unsigned char)(i * 31u);
  if (kvtier_store_block(c, &(kvtier_prompt){tokens, 16, NULL, 0}, NULL, in, bytes, hash, NULL) != KVTIER_OK ||
      kvtier_load_block(c, hash, tokens, 16, out, bytes, &found) != KVTIER_OK || !found ||
      memcmp(in, out, bytes) != 0) {
    fprintf(stderr, "round trip failed: %s\n", kvtier_last_error());
    return 1;
  }
  kvtier_close(c, NULL);
  free(in);
  free(out);
  printf("c ok %d\n", kvtier_version());
  return 0;
}
