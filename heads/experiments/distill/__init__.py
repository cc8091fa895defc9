"""The distill room: a teacher (a head, a grid's ensemble, a tuned encoder with its head) into one head on the
frozen features (`cli distill`), its report in and out of domain, and a tuned teacher's store."""
