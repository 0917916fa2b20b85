"""A1111 prompt syntax: `(word)`, `[word]`, `(word:1.3)`, escapes, `BREAK`, prompts longer than 77 tokens, prompt
editing `[a:b:when]`, alternation `[a|b]` and `AND` (`schedule`).

`parse` reads the syntax (pure Python, no torch), `chunks` turns a prompt into 75-token chunks of
token ids and weights, `encode` runs the text encoders into the embeddings a diffusers pipeline takes.
Nothing is imported here so that `import lowvram_gen.prompting.parse` stays light; see
docs/prompt-syntax.md for the rules and why the encoder is our own code.
"""
