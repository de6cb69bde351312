"""``IPython.display``: the two names ``sglang.utils`` binds."""


class HTML(str):
    pass


def display(*objects, **kwargs):
    print(*objects)
