#!/usr/bin/perl
# Chat rendering by pieces and their tokenization (t/c/test_chat.c,
# ASan+UBSan): message content never becomes a control token.
exec './build/t/test_chat' or die "cannot run build/t/test_chat: $!";
