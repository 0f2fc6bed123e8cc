// SPDX-License-Identifier: GPL-2.0
/*
 * radio-load OBJ PINDIR: registers the congestion control in OBJ (a BPF
 * struct_ops object) with the kernel and pins its maps, and the struct_ops
 * map itself, in PINDIR (a folder on bpffs that exists).
 *
 * Registration outlives this process: the kernel holds the struct_ops map
 * while it is registered. Unregistering is a delete of its one element,
 * through the pin (pepctl does that with bpf(2)), then removing the pins.
 * Maps already pinned in PINDIR are reused, so subscribers' state survives
 * a re-registration of the same layout.
 *
 * Exit 0 and one line "registered NAME" on success; on failure exit 1 with
 * what failed on stderr.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

static int quiet(enum libbpf_print_level level, const char *fmt, va_list args)
{
	/* libbpf's warnings name the step that failed: keep them, drop its debug chatter. */
	return level == LIBBPF_DEBUG ? 0 : vfprintf(stderr, fmt, args);
}

int main(int argc, char **argv)
{
	struct bpf_object *obj;
	struct bpf_map *map, *ops = NULL;
	struct bpf_link *link;
	char path[4096];
	int err;

	if (argc != 3) {
		fprintf(stderr, "usage: %s OBJ PINDIR\n", argv[0]);
		return 2;
	}
	libbpf_set_print(quiet);
	obj = bpf_object__open_file(argv[1], NULL);
	if (!obj) {
		fprintf(stderr, "radio-load: open %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	bpf_object__for_each_map(map, obj) {
		if (bpf_map__type(map) == BPF_MAP_TYPE_STRUCT_OPS) {
			ops = map;
			continue;
		}
		if (bpf_map__name(map)[0] == '.')
			continue;   /* .rodata and friends: internal to the object */
		snprintf(path, sizeof(path), "%s/%s", argv[2], bpf_map__name(map));
		if (bpf_map__set_pin_path(map, path)) {
			fprintf(stderr, "radio-load: pin path %s: %s\n", path, strerror(errno));
			goto fail;
		}
	}
	if (!ops) {
		fprintf(stderr, "radio-load: %s has no struct_ops map\n", argv[1]);
		goto fail;
	}
	err = bpf_object__load(obj);
	if (err) {
		fprintf(stderr, "radio-load: load %s: %s\n", argv[1], strerror(-err));
		goto fail;
	}
	link = bpf_map__attach_struct_ops(ops);
	if (!link) {
		err = errno;
		fprintf(stderr, "radio-load: register %s: %s%s\n", bpf_map__name(ops), strerror(err),
			err == EEXIST ? " (a congestion control of that name is registered already)" : "");
		goto fail;
	}
	snprintf(path, sizeof(path), "%s/%s", argv[2], bpf_map__name(ops));
	err = bpf_map__pin(ops, path);
	/* The kernel keeps the registration; this process only lets go of it. */
	bpf_link__disconnect(link);
	bpf_link__destroy(link);
	if (err) {
		fprintf(stderr, "radio-load: pin %s: %s (it stays registered: unregister it with "
			"`bpftool struct_ops unregister name %s`)\n", path, strerror(-err), bpf_map__name(ops));
		goto fail;
	}
	printf("registered %s\n", bpf_map__name(ops));
	bpf_object__close(obj);
	return 0;
fail:
	bpf_object__close(obj);
	return 1;
}
