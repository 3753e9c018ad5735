#!/usr/bin/perl
# Chat templates on the engine thread: the deferred prompt and the
# protocol layer's variables, pieces and errors (C unit test under
# ASan/UBSan).
exec './build/t/test_chat_template'
    or die "cannot run build/t/test_chat_template: $!";
