"""Small real-language pages for the language tests: prose as manual pages and documentation
write it, in several languages, with the option lists, command lines and code that technical
pages carry. ``PAGES`` maps a name to (expected language, text)."""

from __future__ import annotations

EN_CODE = """\
Installing the package

Create a virtual environment first, then install the package with its optional extras.
The command below works on Linux and macOS; on Windows use the activate script instead.

    $ python3 -m venv .venv
    $ .venv/bin/pip install -e '.[dev]'
    $ export CURATION_HOME=/srv/curation

def read_config(path: str) -> dict[str, Any]:
    with open(path) as fh:
        return yaml.safe_load(fh) or {}

  -h, --help            show this help message and exit
  --workdir DIR         working directory (default: ./workdir)
  --crawl NAME          crawl name, e.g. 2026-05

If the working directory does not exist, it is created when the first crawl is registered.
Every stage writes its outputs under a folder named after its parameters, so that a change
of threshold never reads a stale result.
"""

EN_MAN = """\
NAME
       rsync - a fast, versatile, remote (and local) file-copying tool

SYNOPSIS
       Local:
           rsync [OPTION...] SRC... [DEST]

       Access via remote shell:
           rsync [OPTION...] [USER@]HOST:SRC... [DEST]

DESCRIPTION
       Rsync is a fast and extraordinarily versatile file copying tool. It can copy locally,
       to/from another host over any remote shell, or to/from a remote rsync daemon. It offers
       a large number of options that control every aspect of its behavior.

OPTIONS
       --verbose, -v
              This option increases the amount of information you are given during the
              transfer.

       --checksum, -c
              This changes the way rsync checks if the files have been changed and are in
              need of a transfer.
"""

DE = """\
BESCHREIBUNG
       Der Befehl kopiert Dateien zwischen zwei Verzeichnissen und behält dabei die
       Zugriffsrechte bei. Wenn das Zielverzeichnis nicht existiert, wird es angelegt.

OPTIONEN
       -v, --verbose
              Gibt ausführliche Informationen über jeden Schritt aus.

       -n, --dry-run
              Zeigt nur an, was getan würde, ohne tatsächlich etwas zu verändern.

BEISPIELE
       $ kopieren -v /home/anna/Dokumente /mnt/sicherung

       Die Sicherung sollte regelmäßig überprüft werden, damit im Notfall keine Daten
       verloren gehen.
"""

FR = """\
DESCRIPTION
       Cette commande affiche la liste des fichiers d'un répertoire. Par défaut, les fichiers
       cachés ne sont pas affichés et la liste est triée par ordre alphabétique.

OPTIONS
       -a, --all
              Afficher aussi les fichiers dont le nom commence par un point.

       -l     Utiliser un format d'affichage long, avec les droits et la taille.

EXEMPLE
       $ liste -la /etc

       Si le répertoire n'existe pas, un message d'erreur est écrit sur la sortie d'erreur.
"""

ES = """\
El programa comprime los archivos indicados y guarda el resultado en el directorio actual.
Si no se indica ningún archivo, lee la entrada estándar y escribe en la salida estándar.

Opciones:
  -k, --keep     conservar los archivos originales
  -9, --best     usar la compresión más lenta pero más eficaz

Ejemplo de uso:
  $ comprimir -k informe.txt

Los archivos comprimidos pueden descomprimirse más tarde con la opción correspondiente.
"""

RU = """\
ОПИСАНИЕ
       Программа выводит содержимое файлов на стандартный вывод. Если файл не указан,
       читается стандартный ввод.

ПАРАМЕТРЫ
       -n, --number
              нумеровать все строки вывода

       -s, --squeeze-blank
              удалять повторяющиеся пустые строки

ПРИМЕР
       $ cat -n /etc/hosts

       Эта команда часто используется вместе с другими программами в конвейере.
"""

ZH = """\
描述
       本命令用于在系统中创建一个新的用户帐户，并根据默认设置初始化用户的主目录。
       如果没有指定任何选项，将使用配置文件中的默认值。

选项
       -d, --home-dir HOME_DIR
           新用户的主目录将被设置为指定的目录。

       -m, --create-home
           如果用户的主目录不存在，则创建它。

示例
       $ useradd -m -d /home/zhang zhang

       创建用户之后，请使用密码命令为该用户设置一个安全的密码。
"""

JA = """\
説明
       このコマンドは、指定されたファイルの内容を画面に表示します。ファイルが指定されない場合は、
       標準入力から読み込みます。

オプション
       -n, --number
              すべての出力行に行番号を付けます。

例
       $ cat -n /etc/hosts

       大きなファイルを表示する場合は、ページャーと組み合わせて使うと便利です。
"""

CODE_ONLY = """\
int main(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        printf("%d: %s\\n", i, argv[i]);
    }
    return 0;
}
"""

PAGES: dict[str, tuple[str, str]] = {
    "en_code": ("en", EN_CODE),
    "en_man": ("en", EN_MAN),
    "de": ("de", DE),
    "fr": ("fr", FR),
    "es": ("es", ES),
    "ru": ("ru", RU),
    "zh": ("zh", ZH),
    "ja": ("ja", JA),
}
