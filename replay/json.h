/* A small JSON reader: enough to load a compiled TRex ASTF profile.
 * The whole document is parsed into a tree of nodes; strings are unescaped
 * and NUL-terminated (their length is kept too, for base64 payloads). */
#ifndef PEP_REPLAY_JSON_H
#define PEP_REPLAY_JSON_H

#include <stddef.h>

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jnode {
	enum jtype type;
	double num;            /* J_NUM, J_BOOL (0/1) */
	char *str;             /* J_STR */
	size_t len;            /* J_STR: bytes; J_ARR/J_OBJ: children */
	struct jnode *kids;    /* J_ARR/J_OBJ: children */
	char **keys;           /* J_OBJ: key of each child */
};

/* Parses text[0..n). Returns NULL and fills err (with the line) on bad input. */
struct jnode *json_parse(const char *text, size_t n, char *err, size_t errlen);
void json_free(struct jnode *root);

/* Member of an object, or NULL when absent or when o is not an object. */
const struct jnode *json_get(const struct jnode *o, const char *key);
/* Element i of an array, or NULL. */
const struct jnode *json_at(const struct jnode *a, size_t i);

#endif
