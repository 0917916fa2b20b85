"""The Gradio web UI. Imported only by `lowvram-gen ui`: importing lowvram_gen never loads gradio."""
