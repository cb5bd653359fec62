/* The headers rdma-verbs-sys binds (scripts/gen-bindings). */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
