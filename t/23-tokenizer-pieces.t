#!/usr/bin/perl
# A prompt tokenized from pieces (t/c/test_tokenizer_pieces.c, ASan+UBSan):
# the ids of the whole text, control tokens only inside template markup;
# end of generation from metadata; NFC; the deepseek-v3 pre-tokenizer.
exec './build/t/test_tokenizer_pieces'
    or die "cannot run build/t/test_tokenizer_pieces: $!";
