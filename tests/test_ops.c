/* Every op's gradient against central differences (the table in ops/op_checks.c). */
#include "../cgrad.h"
#include "check.h"

int main(void) {
    int failed = cg_gradcheck_ops(stdout, 0, NULL);
    CHECK(failed == 0, "%d gradient checks failed", failed);
    TEST_END();
}
