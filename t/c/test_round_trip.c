/*
 * nalar verify-bench's cache-line round trip between two threads
 * (line_round_trip_ns in cli/bench_verify.c, included here for its static
 * function) always stops: a peer answering the last trip after the stop
 * signal once overwrote it and spun for good, hanging 3 of 12 runs of
 * verify-bench.  Each call below ends the same way a run does (its time
 * limit or its trip count, then the stop and the join), so 16 calls are 16
 * chances for that race, without the model passes a run of the command
 * adds: at a hang rate of 3 in 12 per stop, 16 stops miss it with
 * probability 0.75^16 = 0.01 (power 0.99; the eight runs of the command
 * this replaces had 0.92).  A hang spins forever; the alarm turns it into
 * a failure.
 */
#include <signal.h>
#include <unistd.h>

#include "../../cli/bench_verify.c"
#include "../../cli/opts.c"
#include "tap.h"

#define STOPS 16


int
main(void)
{
    int good = 0;

    alarm(600);     /* a backstop: 16 calls took 91 s at load 20 on 2 cores */
    for (int i = 0; i < STOPS; i++) {
        double ns = line_round_trip_ns();

        good += ns > 0;
    }
    diag("the last round trip: %.0f ns", line_round_trip_ns());
    is_int(good, STOPS, "%d round trips measured, each peer stopped and "
           "joined", STOPS);
    return done_testing();
}
