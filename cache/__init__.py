"""The persistent prefix KV cache library. It never imports chatapp."""
