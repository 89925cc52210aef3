/* Test tool for the board's catch-up rule (shim.h, cgpu_board_holds_stop): reads lines "LAUNCHED N STOP" (the
 * collectives a rank launched before this launch, the collectives the launch holds, the turn's stop) and prints, for
 * each, 1 when the launch may go on past the turn's deadline, else 0. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>

#include "shim.h"

int main(void) {
    uint64_t launched, stop;
    int n;
    while (scanf("%" SCNu64 " %d %" SCNu64, &launched, &n, &stop) == 3)
        printf("%d\n", cgpu_board_holds_stop(launched, n, stop));
    return 0;
}
